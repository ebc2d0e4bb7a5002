"""Op units: each DeepSpeed op built as its own unit, cached, and the wheel assembled from them.

A unit is one op compiled by DeepSpeed's own setup.py with only that op enabled: its own key
(everything that changes its bytes), its own log and its own result. Built units are kept in a
cache (the work folder's, or one several builders share) and reused by every recipe, matrix target
and Slurm task with the same inputs, so adding an op compiles that op alone, and one failing op
throws no other op's compile away. `assemble` merges the unit wheels into the wheel a single
setup.py run over the same ops would have made: the ops' shared objects together, `installed_ops`
merged, everything else checked identical.

plan (pure): units and their keys; cache: the unit record, one writer and one validating loader;
runner: builds units side by side; assemble: merges them.
"""
