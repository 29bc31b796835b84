"""Built-in tool domains with their packaged task files (``builtin:bank`` is ``bank_tasks.jsonl``)."""
