"""Rollouts: generation into the dock, plain, queued, partial and with tools; run by the actor worker (colocated)
and the generator workers (disaggregated).

    prompts.py     the run's prompt order, the length policy's left-out prompts, each worker's ``PromptTable``
    plain.py       single-turn generation into the dock window, chunk by chunk; the columns and metrics it writes
    queue.py       ``RolloutQueue``: the work of an iteration handed out on demand, parked groups between
                   iterations (partial rollout's policy); ``QueueClient`` calls it here or as a Ray actor
    partial.py     partial rollout: rollouts continued under a token budget, groups parked and resumed
    multi_turn.py  multi-turn rollouts with tools in the rollout layout, and partial rollout's ``ToolGroups``

Layering: this package may import ``Config``, ``dockflow.engines``, ``dockflow.agents``, ``dockflow.dock``,
``dockflow.data`` and ``dockflow.eval``; none of those imports it, and it imports neither ``dockflow.workers``
nor ``dockflow.flow`` (``tests/unit/test_layers.py``, ``tests/unit/test_import_edges.py``). What the lower rooms
share with it stays there: the rollout layout's builders (``dockflow.engines.token_layout``), the turn sampler
over an engine (``dockflow.engines.turn_sampler``) and the batched tool loop (``dockflow.agents.batch_loop``).
"""
