"""Engine sets: what a vLLM host installs (vLLM, LMCache and torch of one build), as data.

`sets` holds the models and the built-in sets (the kvoffload_python role's data file), `lab` resolves
which set each node of a lab installs, `pins` checks that a set's pins agree on one torch. Between
kvoffload.config (whose campaign model holds user-defined sets, from `sets` only) and kvoffload.orchestrate
(the wheelhouse, the checks, the cell's extravars). Nothing here runs pip or touches a host.
"""
