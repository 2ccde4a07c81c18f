"""What the API, the worker and the CLI share: settings, logging, the queue and the job statuses.

``core`` imports none of ``api``, ``worker``, ``store`` or ``cli`` (``tests/test_import_rules.py`` checks it),
so each of them can depend on it without pulling in another.
"""
