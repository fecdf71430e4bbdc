"""A failed stage reads as one line: the worker's own error by its message, any other by type and message."""

from ray.exceptions import RayTaskError

from dockflow.flow.waiting import StageError, error_message, stage_error
from dockflow.rewards.functions import RewardError


def test_dockflow_errors_read_as_their_message_and_others_as_type_and_message():
    assert error_message(RewardError("reward function 'f' raised ValueError: no")) == "reward function 'f' raised ValueError: no"
    assert error_message(ValueError("boom")) == "ValueError: boom"
    assert error_message(KeyError()) == "KeyError"
    assert error_message(RuntimeError("two\n  lines")) == "RuntimeError: two lines"


def test_a_remote_task_error_becomes_a_stage_error_naming_the_stage_with_the_cause_message():
    cause = RewardError("reward function 'explodes' raised RuntimeError: kaboom on sample 3")
    wrapped = RayTaskError("compute_rewards", "Traceback ...", cause)
    err = stage_error(wrapped, "reward", 0)
    assert isinstance(err, StageError) and not err.worker_died
    assert str(err) == "iteration 0: stage 'reward' failed: reward function 'explodes' raised RuntimeError: kaboom on sample 3"
    assert stage_error(ValueError("x"), "update", 2).args[0] == "iteration 2: stage 'update' failed: ValueError: x"
