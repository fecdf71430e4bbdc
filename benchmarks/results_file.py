"""What every benchmark writes: ``{"machine": {...}, "results": [...]}``, the machine described the same way."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def machine_info(**extra: Any) -> dict[str, Any]:
    """Platform, CPU count and Python version, plus what a benchmark adds (library versions, sizes)."""
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "python": platform.python_version(), **extra}


def write_results(path: str | Path, results: list[dict[str, Any]], **machine: Any) -> None:
    """Write the results with the machine they were measured on."""
    Path(path).write_text(json.dumps({"machine": machine_info(**machine), "results": results}, indent=2))
