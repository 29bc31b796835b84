"""Built-in tool domains and their packaged task files.

``TASK_SETS`` maps each ``builtin:NAME`` to its file in this package. The bank domain (``envace.builtin.bank``) ships
four splits: ``builtin:bank`` (the training split; ``builtin:bank-train`` is the same file), ``builtin:bank-val``,
``builtin:bank-test`` and ``builtin:bank-heldout`` (held-out task templates). ``python -m envace.builtin.make_tasks``
regenerates them; see ``docs/builtin-domain.md``. ``builtin:NAME:N`` generates the first ``N`` tasks of a split instead
(deterministic; the packaged file holds the first ones), e.g. ``builtin:bank:2000`` for more demonstrations.
"""

TASK_SETS: dict[str, str] = {
    "bank": "bank_tasks.jsonl",
    "bank-train": "bank_tasks.jsonl",
    "bank-val": "bank_val.jsonl",
    "bank-test": "bank_test.jsonl",
    "bank-heldout": "bank_heldout.jsonl",
}
"""Packaged task file of each built-in task set name (``builtin:NAME``)."""

SPLIT_OF: dict[str, str] = {"bank": "train", "bank-train": "train", "bank-val": "val", "bank-test": "test",
                            "bank-heldout": "heldout"}
"""The generator split behind each built-in task set name."""
