from __future__ import annotations

import os
import signal
import time

import pytest
from pydantic import ValidationError

from dockflow.agents import ToolError, ToolHost, import_tool, tool_schema
from dockflow.config.tools import ToolsConfig
from tests.unit.agents.tools_for_tests import Counter, add, crash, divide, shout, wait


def test_import_by_path_and_schema() -> None:
    fn = import_tool("tests.unit.agents.tools_for_tests:add")
    assert fn is add
    schema = tool_schema(fn)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first integer.",
    }


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("no_such_module_x:add", "cannot import module"),
        ("tests.unit.agents.tools_for_tests:nope", "has no callable 'nope'"),
    ],
)
def test_bad_path_is_one_clear_error(path: str, words: str) -> None:
    with pytest.raises(ToolError, match=words):
        import_tool(path)


def test_a_function_without_hints_has_no_schema() -> None:
    def bare(x):  # noqa: ANN001, ANN202 - the point of the test
        return x

    with pytest.raises(ToolError, match="type hint"):
        tool_schema(bare)


def test_calls_errors_and_unknown_names_answer_as_trl_does() -> None:
    with ToolHost([add, divide], timeout_s=5.0) as host:
        assert host.call("add", {"a": 3, "b": 4}).content == "7"
        raised = host.call("divide", {"a": 1, "b": 0})
        assert raised.error and raised.content == "{'error': 'division by zero'}"
        unknown = host.call("multiply", {"a": 1, "b": 2})
        assert unknown.error and unknown.content == "{'error': 'Tool multiply not found.'}"
        wrong = host.call("add", {"a": 1, "c": 2})
        assert wrong.error and "unexpected keyword argument 'c'" in wrong.content
        assert host.call("add", {"a": 1, "b": 1}).content == "2"  # the same child still serves


def test_an_async_tool_is_awaited() -> None:
    with ToolHost([shout], timeout_s=5.0) as host:
        assert host.call("shout", {"text": "hi"}).content == "HI"


def test_a_tool_that_hangs_is_killed_at_the_timeout() -> None:
    with ToolHost([wait, add], timeout_s=0.5) as host:
        assert host.call("add", {"a": 1, "b": 1}).content == "2"
        child = host.pid
        started = time.monotonic()
        out = host.call("wait", {"seconds": 30})
        assert time.monotonic() - started < 3.0
        assert out.timed_out and out.error and "timed out after 0.5 s" in out.content
        assert host.pid is None and not os.path.exists(f"/proc/{child}")  # the child that ran it is gone
        assert host.call("add", {"a": 2, "b": 2}).content == "4"  # a fresh child serves the next call


def test_a_tool_that_ends_its_process_is_an_error_turn() -> None:
    with ToolHost([crash, add], timeout_s=5.0) as host:
        out = host.call("crash", {})
        assert out.error and not out.timed_out
        assert out.content == "{'error': 'tool crash failed: its process ended (exit code 3)'}"
        assert host.call("add", {"a": 2, "b": 3}).content == "5"


def test_a_child_killed_between_calls_is_reported_then_replaced() -> None:
    with ToolHost([add], timeout_s=5.0) as host:
        assert host.call("add", {"a": 1, "b": 1}).content == "2"
        os.kill(host.pid, signal.SIGKILL)
        time.sleep(0.2)
        out = host.call("add", {"a": 1, "b": 1})
        assert (
            out.error
            and not out.timed_out
            and "tool add failed: its process ended (exit code -9)" in out.content
        )
        assert host.call("add", {"a": 1, "b": 1}).content == "2"


def test_an_environment_lives_in_the_child_and_is_lost_when_killed() -> None:
    with ToolHost([add], factory=Counter, timeout_s=0.5) as host:
        assert host.names == {"add", "increment", "stall"}
        assert [s["function"]["name"] for s in host.schemas()] == ["add", "increment", "stall"]
        assert host.reset({"target": 2}) == " (counter at 0, target 2)"
        assert host.call("increment", {"by": 2}).content == "2"
        assert host.reward() == 1.0
        assert host.call("stall", {}).timed_out
        lost = host.call("increment", {"by": 1})
        assert lost.error and "environment was stopped" in lost.content
        assert host.reward() is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"functions": ["my_tools.add"]}, "tool path 'my_tools.add' must be module:attribute"),
        ({"environment": "Calc"}, "environment path 'Calc' must be module:attribute"),
        ({"environment": "e:A", "environments": {"a": "e:A"}}, "not both"),
        ({"max_turns": 0}, "max_turns"),
    ],
)
def test_the_tools_section_rejects_bad_input_with_one_line(fields: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        ToolsConfig(**fields)


def _written_pipes(pid: int) -> set[str]:
    """The pipes process ``pid`` holds a write end of (``pipe:[inode]``)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            flags = int(next(line for line in info if line.startswith("flags:")).split()[1], 8)
        if target.startswith("pipe:") and flags & os.O_WRONLY:
            out.add(target)
    return out


def test_children_started_from_many_threads_hold_no_siblings_exit_pipe() -> None:
    """The tool pool starts children from the stream driver's threads. A child forked while another host was
    starting its own would inherit the write end of that sibling's exit pipe (its sentinel): reaping the sibling
    then waited out the join timeout, until this child ended too. Here no child holds a write end of another
    child's exit pipe, and a pool reaps its children at once."""
    import threading

    from dockflow.agents.tool_host import ToolHostPool

    with ToolHostPool([add, wait], timeout_s=5.0) as pool:
        gate = threading.Barrier(6)

        def call() -> None:
            gate.wait()
            pool.call("wait", {"seconds": 0.5})  # all at once: a child each

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hosts = list(pool._hosts)
        assert len(hosts) >= 4
        exit_pipes = {h.pid: os.readlink(f"/proc/self/fd/{h._proc.sentinel}") for h in hosts}
        for h in hosts:
            others = {pipe for pid, pipe in exit_pipes.items() if pid != h.pid}
            assert not _written_pipes(h.pid) & others, h.pid
        pids = list(exit_pipes)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # all reaped on close
