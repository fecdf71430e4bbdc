"""Ray actors that hold the models: actor (policy), reference, reward. They exchange samples only
through the transfer dock; the driver sends iteration numbers and prompt indices."""

from dockflow.workers.group import Workers, WorkerStartError, create_workers, kill_workers

__all__ = ["WorkerStartError", "Workers", "create_workers", "kill_workers"]
