"""A sweep's jobs through one of Hydra's launcher plugins (`compbench train -m hydra/launcher=NAME`):
`joblib` runs them as parallel local processes (hydra-joblib-launcher, `hydra.launcher.n_jobs=N`),
`submitit_slurm` submits them to SLURM and `submitit_local` runs them as local submitit jobs
(hydra-submitit-launcher); each plugin takes its own `hydra.launcher.*` settings. Without a launcher
(or with `basic`) compbench.cli.sweep runs the jobs one after another itself.

compbench composes its configs itself (recipes, model aliases, checks: compbench.compose.config), so a plugin
gets only Hydra's part: the master config is the train config with the launcher's overrides, and a
job's overrides are only its folder (`hydra.sweep.subdir`). The task function maps that folder back
to the job's compbench overrides and runs compbench.cli.run.train there, as the sequential runner does.
Every job is checked before anything starts (compbench.cli.sweep.run_sweep), and so is the launcher
(its name, its settings) before the sweep's folder is made. Hydra's own per-job files are off (no
`.hydra/` of the plugin, no job logging): the run writes its own `.hydra/`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compbench.base.args import override_key
from compbench.records.rundir import hydra_quoted

BASIC = "basic"  # Hydra's in-process sequential launcher: compbench's own runner does that job
# Hydra's part of the master config: no files or logging of its own in the job folders.
_QUIET = ("hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none",
          "hydra.job.chdir=false")
_INSTALL = "joblib: pip install hydra-joblib-launcher; submitit_local, submitit_slurm: pip install " \
           "hydra-submitit-launcher"


def is_launcher_override(override: str) -> bool:
    key = override_key(override)
    return key == "hydra/launcher" or key.startswith("hydra.launcher.")


def chosen(overrides: list[str]) -> str:
    """The launcher the overrides pick (`basic` when none)."""
    picks = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "hydra/launcher"]
    return picks[-1] if picks else BASIC


@dataclass
class PluginSweep:
    """A Hydra launcher plugin whose settings were checked, ready to launch."""

    name: str
    overrides: list[str]   # the launcher's overrides (hydra/launcher=NAME, hydra.launcher.KEY=V)
    loader: Any            # hydra's ConfigLoaderImpl over compbench's conf

    def master(self, root: Path | None = None) -> Any:
        """The train config with Hydra's node in multirun mode, its sweep folder `root`. A job's config
        is composed again from the master's overrides, so the folder must be one of them."""
        from hydra.types import RunMode

        folder = [f"hydra.sweep.dir={hydra_quoted(str(root))}"] if root is not None else []
        overrides = [*self.overrides, *_QUIET, *folder]
        return self.loader.load_configuration(config_name="train", overrides=overrides,
                                              run_mode=RunMode.MULTIRUN)

    def launch(self, jobs: list[list[str]], names: list[str], root: Path) -> list[int]:
        """Run the jobs (job i in root/names[i]); their exit codes in order (1 for a job whose task
        raised)."""
        from hydra._internal.callbacks import Callbacks
        from hydra.core.plugins import Plugins
        from hydra.core.utils import JobStatus
        from hydra.types import HydraContext

        master = self.master(root)
        context = HydraContext(config_loader=self.loader, callbacks=Callbacks(master))
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=context, task_function=TrainJob(dict(zip(names, jobs, strict=True)), os.getpid()),
            config=master)
        folders = [[f"hydra.sweep.subdir={hydra_quoted(n)}"] for n in names]
        returns = launcher.launch(folders, initial_job_idx=0)
        return [int(r.return_value) if r.status == JobStatus.COMPLETED else 1 for r in returns]


def prepare(overrides: list[str]) -> PluginSweep | None:
    """The plugin the launcher overrides name, its settings checked (one line for a launcher that is
    not installed or a setting it does not take); None for compbench's own sequential runner."""
    name = chosen(overrides)
    settings = [o for o in overrides if o.partition("=")[0] != "hydra/launcher"]
    if name == BASIC:
        if settings:
            raise ValueError(f"{settings[0].partition('=')[0]} is a launcher plugin's setting; pick the "
                             f"plugin too, e.g. hydra/launcher=joblib ({_INSTALL})")
        return None
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.plugins import Plugins
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from compbench.catalog import registry

    Plugins.instance()  # discovers the installed plugins, which register their launcher configs
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(registry.conf_dir())))
    options = loader.get_group_options("hydra/launcher")
    if name not in options:
        raise ValueError(f"hydra/launcher={name} is not an installed launcher; choose from "
                         f"{', '.join(options)} ({_INSTALL})")
    plugin = PluginSweep(name, overrides, loader)
    try:
        launcher = plugin.master().hydra.launcher
    except (HydraException, OmegaConfBaseException) as e:
        why = (str(e.__cause__ or e).strip().splitlines() or [type(e).__name__])[0]
        keys = PluginSweep(name, [f"hydra/launcher={name}"], loader).master().hydra.launcher
        takes = ", ".join(k for k in keys if k != "_target_")
        raise ValueError(f"{', '.join(settings)}: {why}; hydra/launcher={name} takes {takes}") from None
    from compbench.cli import launcher_settings

    launcher_settings.check(name, launcher)
    return plugin


@dataclass
class TrainJob:
    """The task function a plugin runs (pickled into its processes): the job of the folder Hydra
    made for it, by name. The process running it dies with the sweep's (`sweep_pid`), SIGKILL
    included: a plugin's pool (joblib's loky workers) would otherwise go on alone, each with its
    job's workers."""

    jobs: dict[str, list[str]]
    sweep_pid: int

    def __call__(self, _hydra_cfg: Any) -> int:
        from hydra.core.hydra_config import HydraConfig

        from compbench.cli.run import train
        from compbench.launch.processes import die_with_process

        if os.getpid() != self.sweep_pid:  # a plugin that runs jobs in the sweep's own process: nothing to do
            die_with_process(self.sweep_pid)

        out = Path(HydraConfig.get().runtime.output_dir)
        return train([*self.jobs[out.name], f"output_dir={hydra_quoted(str(out))}"])
