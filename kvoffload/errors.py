"""Errors the user can act on.

Every layer raises `UserError` for bad input (a file, a key, a flag); the CLI turns it into one line on
stderr and exit status 2, never a traceback. The message must name the file and key (or flag) and the fix.
"""


class UserError(Exception):
    """Bad input that the user can fix; the message says where and how."""

    exit_code = 2
