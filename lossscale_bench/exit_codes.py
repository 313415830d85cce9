"""``lsbench``'s exit codes, in one place (README "Exit codes"; scripts and schedulers branch on them).

Why a module of its own at the bottom layer: the CLI returns them, and so does code below it that
ends a command itself (``tracking.ui_server`` stopping ``mlflow server`` on a signal); a second copy
of the numbers there could drift from the documented ones.
"""

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_TRIALS_FAILED = 3
EXIT_STORE = 4
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGPIPE = 141
