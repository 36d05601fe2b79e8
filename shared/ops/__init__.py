"""One typed unit per Lua script of ``shared/lua``: the call built from typed arguments,
the reply parsed into a typed result, the outcome codes as an enum. Flows
(``shared.flows``) and the worker's queue (``worker.queue``) compare enums, never
strings; a script's contract changes in its unit and its Lua file, nowhere else."""
