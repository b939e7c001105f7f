"""The principal's approvals console (issue 18, item 2): `app.py`, `command.py`."""
