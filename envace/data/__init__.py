"""Task data: the JSONL task format and its loader (``envace.data.tasks``)."""
