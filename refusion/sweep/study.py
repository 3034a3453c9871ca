"""The sweep's storage: an optuna study in a local SQLite file, one trial per evaluated point.

Every trial is written when it finishes, so an interrupted sweep keeps what it
evaluated and a later run with the same file and study name resumes it. A
study remembers the sweep that made it (space, tasks, generation length,
objective, mode); resuming it with a different one is an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from refusion.errors import ConfigError

OBJECTIVES = {"forwards": "forwards", "wall": "seconds_per_token"}


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "`refusion sweep` needs optuna: pip install 'refusion[research]'.", param="refusion sweep"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_study(path: str | Path, name: str, signature: Mapping[str, Any]) -> Any:
    """Load study ``name`` from the SQLite file ``path`` (creating both if absent); directions: accuracy up, cost
    down."""
    optuna = _optuna()
    path = Path(path)
    if path.exists() and (not path.is_file() or not _looks_like_sqlite(path)):
        raise ConfigError(
            f"`storage` {str(path)!r} is not an SQLite database of optuna trials; "
            "name a new file or the one an earlier sweep wrote.",
            param="storage",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        storage = optuna.storages.RDBStorage(f"sqlite:///{path.resolve()}")
        names = [s.study_name for s in optuna.study.get_all_study_summaries(storage)]
    except Exception as exc:  # sqlalchemy and optuna raise many kinds for a broken file
        raise ConfigError(f"`storage` {str(path)!r} cannot be read as optuna storage: {exc}", param="storage") from None
    wanted = json.loads(json.dumps(signature, default=str))
    if name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        found = study.user_attrs.get("signature")
        if found != wanted:
            diff = sorted(k for k in set(wanted) | set(found or {}) if (found or {}).get(k) != wanted.get(k))
            raise ConfigError(
                f"`storage` {str(path)!r} holds study {name!r} of a different sweep "
                f"(differs in: {', '.join(diff)}); resume it with the same settings, "
                "or give another --study name or storage file.",
                param="storage",
            )
        return study
    study = optuna.create_study(study_name=name, storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("signature", wanted)
    return study


def _looks_like_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head == b"SQLite format 3\x00" or head == b""


@attrs.frozen
class TrialRecord:
    """One evaluated point: its optuna trial number, the point, its metrics and ratios to AR in the run that measured
    it."""

    number: int
    point: dict[str, Any]
    metrics: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]


def completed(study: Any) -> list[TrialRecord]:
    """Every finished trial of ``study``, in trial order."""
    optuna = _optuna()
    out = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs_ = dict(trial.user_attrs)
        point = attrs_.pop("point", dict(trial.params))
        out.append(TrialRecord(trial.number, point, attrs_))
    return out


def failed(study: Any) -> list[Any]:
    """Trials whose decoder could not be built or raised (their ``error`` user attribute says why)."""
    optuna = _optuna()
    return [
        t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)) if "error" in t.user_attrs
    ]
