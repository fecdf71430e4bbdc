"""Tools and an environment written as a TRL user writes them (TRL 1.16's tools= and environment_factory)."""

from __future__ import annotations

import functools
import os
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def divide(a: int, b: int) -> float:
    """Divide one integer by another.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def wait(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "done"


async def shout(text: str) -> str:
    """Say it louder (an async tool, which TRL accepts).

    Args:
        text: What to say.
    """
    return text.upper()


def crash() -> str:
    """End the process that runs it (as a segfaulting extension would)."""
    os._exit(3)


class Counter:
    """A counter the model must bring to the row's target; rewarded when it gets there."""

    def reset(self, target: int, **kwargs) -> str:
        self.count = 0
        self.target = target
        return f" (counter at 0, target {target})"

    def increment(self, by: int) -> int:
        """Add to the counter and return its new value.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def stall(self) -> str:
        """Never return."""
        time.sleep(3600)
        return "never"

    def get_reward(self) -> float:
        return float(self.count == self.target)

    def _helper(self) -> None:
        """Private: not a tool."""


class Doubler:
    """A second environment, for the dict form of environment_factory."""

    def reset(self, **kwargs) -> None:
        self.value = 1

    def double(self) -> int:
        """Double the value and return it."""
        self.value *= 2
        return self.value



@functools.wraps(add)  # the same name and schema as ``add``: only the tool turn's tokens differ
def add_wrong(a: int, b: int) -> int:
    return a + b + 1


class Tape:
    """The demo's calculator as an environment that keeps a tape of its calls (state a parked rollout must carry
    from turn to turn); rewarded when the last result is the row's answer."""

    def reset(self, answer: str, **kwargs) -> None:
        self.answer, self.tape, self.last = str(answer), [], None

    def calculator(self, a: int, op: str, b: int) -> int:
        """Add or subtract two integers.

        Args:
            a: The first integer.
            op: The operator, "+" or "-".
            b: The second integer.
        """
        self.tape.append(f"{a} {op} {b}")  # before the check: a refused call is on the tape too
        if op not in ("+", "-"):
            raise ValueError(f"op must be '+' or '-', got {op!r}")
        self.last = a + b if op == "+" else a - b
        return self.last

    def get_reward(self) -> float:
        return float(str(self.last) == self.answer)


class Bank:
    """A TRL environment the project's own demos never use: two tools that raise on bad amounts, a ``reset`` whose
    observation (the balance and the goal, from the row's extra columns) is longer than the dataset's prompt, and a
    reward that reads the final balance."""

    def reset(self, balance: int, goal: int, **kwargs) -> str:
        self.balance, self.goal = int(balance), int(goal)
        return f" The account holds {self.balance} units; reach exactly {self.goal} units, then say Done."

    def deposit(self, amount: int) -> int:
        """Put money into the account.

        Args:
            amount: How many units to deposit; positive.
        """
        if amount <= 0:
            raise ValueError(f"amount must be positive, got {amount}")
        self.balance += amount
        return self.balance

    def withdraw(self, amount: int) -> int:
        """Take money out of the account.

        Args:
            amount: How many units to withdraw; positive and at most the balance.
        """
        if not 0 < amount <= self.balance:
            raise ValueError(f"amount must be in 1..{self.balance}, got {amount}")
        self.balance -= amount
        return self.balance

    def get_reward(self) -> float:
        return float(self.balance == self.goal)
