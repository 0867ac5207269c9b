"""Calibration: measure a GPU host and turn the figures into a simulator cost profile.

Sits under `kvoffload/cli/calibrate.py` and beside `kvoffload/sim` (whose profile format it writes).
`shapes` and `raw` are plain data; `gpu` holds every PyTorch measurement and imports torch only inside
its functions, so this package imports on hosts without torch; `disk` measures a directory's drive;
`sanity` checks figures against datasheet ceilings; `profile` converts raw results into a cost profile.
Nothing here prints: progress goes through `logging`.
"""
