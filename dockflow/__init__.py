"""DockFlow: RL post-training of LLMs over a transfer dock.

Importing the package registers the built-in algorithms (``dockflow.algos``), so that any config validated
afterwards knows every ``algorithm.name``; the algorithm modules are light (no torch at import). It first defers
the scikit-learn and SciPy imports that Transformers makes for functions DockFlow never calls
(``dockflow.lazy_imports``: about 2.3 s of CPU in every process that loads a model).
"""

import dockflow.lazy_imports

dockflow.lazy_imports.install()

import dockflow.algos  # noqa: E402, F401 - registers the algorithms with dockflow.config.algorithm
