"""Environment variable names shared by the launcher and the code that runs inside verl.

Kept in a module without imports so the launcher can name them without importing verl.
"""
# Set by the launcher: a file each process that imports the plugin appends one line to.
LOAD_LOG_ENV = "ABLATE_VERL_CPU_LOAD_LOG"
# Set by the launcher: a file each rollout server appends one line per weight sync to.
SYNC_LOG_ENV = "ABLATE_CPU_ROLLOUT_SYNC_LOG"
# Where assets are cached (default: $XDG_CACHE_HOME/ablate_verl_cpu).
CACHE_ENV = "ABLATE_VERL_CPU_CACHE"
