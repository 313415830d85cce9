"""``lsbench``'s exit codes, in one place (docs/reference/exit-codes.md lists each for users; scripts and
schedulers branch on them).

Why a module of its own at the bottom layer: the CLI returns them, and so does code below it that
ends a command itself (``tracking.ui_server`` stopping ``mlflow server`` on a signal); a second copy
of the numbers there could drift from the documented ones. (1, an internal error, is Python's own
exit status for an uncaught exception: the traceback is printed, nobody returns it by name.)
"""

#: every trial finished or diverged (divergence is a result, not a failure)
EXIT_OK = 0
#: a user error, one line: bad study file, option or LSBENCH_* variable, missing path (a store that is not
#: there included), a cluster that cannot run the study
EXIT_USAGE = 2
#: the study ran but one or more trials failed (the others' results are kept and reported)
EXIT_TRIALS_FAILED = 3
#: the tracking store is there but cannot be used (corrupt, read-only, full, locked by another process), cannot
#: be reached, or is not an MLflow store (another web server answers at the URI), or the URI is one lsbench
#: cannot keep results in; for run and report alike; or the joined Ray cluster's head node was lost
#: mid-study (orchestration/head_watch.py); the same command continues
EXIT_STORE = 4
#: interrupted by SIGINT, 128 + 2 (Ctrl-C at the terminal): trial runs are marked KILLED; a re-run resumes
EXIT_SIGINT = 130
#: terminated by SIGTERM, 128 + 15 (``kill``, ``timeout``, a scheduler ending the job): trial runs are
#: marked KILLED; a re-run resumes
EXIT_SIGTERM = 143
#: the reader of standard output went away (``lsbench validate ... | head``)
EXIT_SIGPIPE = 141
