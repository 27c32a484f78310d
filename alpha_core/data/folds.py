"""Walk-forward fold plans over a symbol's chronologically ordered files: one plan for every door.

- `cv_n_folds > 1` (the default, `N_FOLDS`, the number of fold partitions Dagster trains): a sliding window
  of W training files; fold k trains on files [k, k+W),
  validates on file k+W and is tested on file k+W+1. W is `cv_train_window`, or, when 0,
  `n_files - cv_n_folds - 1` (room for a validation and a test file after every fold). A fold
  without a test file is a PlanError unless `allow_untested_folds` (then a warning).
- `cv_n_folds == 1`, an explicit opt-in: the single train/validation split (every file but the last trains,
  the last validates). It has no test file, so nothing it trains is tested out of sample: it warns.

The CLI trainers, `alpha hyperopt`, `alpha folds`, `alpha evaluate` and the Dagster assets all default to
`N_FOLDS` and the same window rule, so the original system's commands and `alpha run` plan the same folds.

Train, validation and test never share a file, and labels are computed per file (NaN past its
end), so no sample or label horizon crosses a split boundary. `check_leakage` proves both, and
`hyperopt_leakage` proves that a hyperparameter search touched no test file (`hyperopt_files`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from alpha_core.errors import PlanError

N_FOLDS = 3  # walk-forward folds per symbol, each with a test file: the default of every door


class FileRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    name: str
    start: int  # ns, metadata start (or first row)
    end: int  # ns, last row / metadata end


class Fold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fold: int
    train: list[FileRef]
    val: list[FileRef]
    test: list[FileRef]


class FoldPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cv_n_folds: int
    cv_train_window: int  # as requested (0 = derived)
    window: int  # resolved number of training files per fold
    n_files: int
    folds: list[Fold]

    def fold(self, k: int) -> Fold:
        if not 0 <= k < len(self.folds):
            raise PlanError(f"--cv-fold {k} must be < --cv-n-folds {self.cv_n_folds}")
        return self.folds[k]


class UntestedFoldWarning(UserWarning):
    """A plan with a fold that has no test file: what that fold trains is never scored out of sample."""


def plan_folds(
    files: list[FileRef], cv_n_folds: int = N_FOLDS, cv_train_window: int = 0, allow_untested_folds: bool = False
) -> FoldPlan:
    """Plan every fold; any layout that does not fit is a PlanError naming the numbers."""
    if cv_n_folds < 1:
        raise PlanError(f"--cv-n-folds must be >= 1 (got {cv_n_folds})")
    if cv_train_window < 0:
        raise PlanError(f"--cv-train-window must be >= 0 (got {cv_train_window})")
    files = sorted(files, key=lambda f: (f.start, f.path))
    n = len(files)
    if cv_n_folds == 1:
        if n < 2:
            raise PlanError(f"need >= 2 files for single-fold temporal split, found {n}")
        folds = [Fold(fold=0, train=files[:-1], val=[files[-1]], test=[])]
        warnings.warn(
            "--cv-n-folds 1 is the single train/validation split: it has no test file, so nothing it "
            "trains is evaluated out of sample",
            UntestedFoldWarning,
            stacklevel=2,
        )
        return FoldPlan(cv_n_folds=1, cv_train_window=cv_train_window, window=n - 1, n_files=n, folds=folds)
    window = cv_train_window if cv_train_window > 0 else max(n - cv_n_folds - 1, 0)
    if window < 1:
        raise PlanError(
            f"{n} files are too few for {cv_n_folds} walk-forward folds (each needs a training, a "
            f"validation and a test file: at least {cv_n_folds + 2} files); lower --cv-n-folds, or pass "
            f"--cv-n-folds 1 for a single train/validation split without a test file"
        )
    last = cv_n_folds - 1
    if last + window + 1 > n:
        raise PlanError(f"CV layout overflows: cv_fold={last} + window={window} + 1 val file > {n} files available")
    untested = [k for k in range(cv_n_folds) if k + window + 1 >= n]
    if untested and not allow_untested_folds:
        raise PlanError(
            f"fold(s) {', '.join(map(str, untested))} would have no test file: {cv_n_folds} folds x window {window} "
            f"need {cv_n_folds + window + 1} files, {n} available (lower --cv-train-window or --cv-n-folds, or "
            f"pass --allow-untested-folds)"
        )
    if untested:
        warnings.warn(
            f"fold(s) {', '.join(map(str, untested))} have no test file ({n} files, {cv_n_folds} folds, "
            f"window {window}): they are trained but never evaluated",
            UntestedFoldWarning,
            stacklevel=2,
        )
    folds = []
    for k in range(cv_n_folds):
        val_idx = k + window
        test = [files[val_idx + 1]] if val_idx + 1 < n else []
        folds.append(Fold(fold=k, train=files[k:val_idx], val=[files[val_idx]], test=test))
    return FoldPlan(cv_n_folds=cv_n_folds, cv_train_window=cv_train_window, window=window, n_files=n, folds=folds)


def check_leakage(plan: FoldPlan) -> list[str]:
    """Problems with a plan: shared files, or splits whose time ranges are not strictly ordered."""
    problems = []
    for fold in plan.folds:
        splits = {"train": fold.train, "val": fold.val, "test": fold.test}
        seen: dict[str, str] = {}
        for split, refs in splits.items():
            for ref in refs:
                key = str(Path(ref.path).resolve())
                if key in seen:
                    problems.append(f"fold {fold.fold}: {ref.name} is in both {seen[key]} and {split}")
                seen[key] = split
        ordered = [(s, refs) for s, refs in splits.items() if refs]
        for (a, ra), (b, rb) in zip(ordered, ordered[1:], strict=False):
            if max(r.end for r in ra) >= min(r.start for r in rb):
                problems.append(f"fold {fold.fold}: {a} data reaches into {b} (time ranges overlap)")
    return problems


def hyperopt_files(plan: FoldPlan) -> tuple[list[FileRef], list[FileRef]]:
    """(train, validation) files of a symbol's hyperparameter search: every file strictly before the plan's
    earliest test file (all files when no fold has one), the last of them validating.

    Tuning once on this range and using the result in every fold never lets a test file choose a parameter."""
    files = sorted(
        {r.path: r for f in plan.folds for r in (*f.train, *f.val, *f.test)}.values(), key=lambda r: (r.start, r.path)
    )
    tests = [r for f in plan.folds for r in f.test]
    if tests:
        first = min(r.start for r in tests)
        files = [r for r in files if r.end < first]
    if len(files) < 2:
        raise PlanError(
            f"hyperopt needs >= 2 files before the first test file (one to train, one to validate), found {len(files)}"
        )
    return files[:-1], files[-1:]


def hyperopt_leakage(plan: FoldPlan, results: dict) -> list[str]:
    """Problems with a hyperopt `results.json` (a dict) against a fold plan: a file it trained or validated on
    that is a test file of any fold, or a results file that does not say which files it used.

    Every fold is checked because one results file serves every fold's checkpoint; a nested search's results
    (`cv_fold=k`, fold k's own files) pass only for k = 0, and must only ever be used for their own fold."""
    used = {split: results.get(f"{split}_files") for split in ("train", "val")}
    missing = [f"{split}_files" for split, names in used.items() if not isinstance(names, list)]
    if missing:
        return [f"hyperopt results do not record {' and '.join(missing)}: the files they used cannot be checked"]
    return [
        f"fold {fold.fold}: test file {ref.name} was a hyperopt {split} file"
        for fold in plan.folds
        for ref in fold.test
        for split, names in used.items()
        if ref.name in names
    ]
