"""DockFlow: RL post-training of LLMs over a transfer dock.

Importing the package registers the built-in algorithms (``dockflow.algos``), so that any config validated
afterwards knows every ``algorithm.name``; the algorithm modules are light (no torch at import).
"""

import dockflow.algos  # noqa: F401 - registers the algorithms with dockflow.config.algorithm
