"""Strategy search: a space of decoders evaluated on a task set, with a Pareto front of accuracy and speed.

``refusion.run_sweep(["selector=threshold,topk", "slot_threshold=0.5:0.9:0.1"])``
or ``refusion sweep --space ...`` on the command line. Modules: ``space``
(dimensions and points), ``spacefile`` (YAML/TOML spaces), ``tasks`` (task
sets), ``evaluate`` (measuring a point and AR), ``study`` (optuna storage),
``run`` (grid and optuna search), ``outputs`` (CSV, PNG, preset JSON).
"""

from refusion.sweep.run import SweepResult, run_sweep
from refusion.sweep.space import Dimension, Space, build_space, parse_dimension
from refusion.sweep.tasks import TaskSet, load_tasks

__all__ = ["Dimension", "Space", "SweepResult", "TaskSet", "build_space", "load_tasks", "parse_dimension", "run_sweep"]
