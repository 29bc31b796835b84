"""The task format.

The task format: JSONL task files read and written (``tasks``), their schema vocabulary and errors
(``task_schema``), a record validated into a ``Task`` (``task_parsing``, with ``task_tools`` and ``task_checklists``)
and rendered back (``task_records``), the queries over a task's reference trajectory (``task_reference``), and the
authors' reference rows' format (``reference_format``). It knows no domain and no model.

May import: envace.types, envace.errors, envace.runtime, envace.envs, envace.roles.
"""
