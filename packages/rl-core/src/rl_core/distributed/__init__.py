"""The distributed layer: where processes go (``placement``: devices, GPU layouts, colocation, thread budgets),
Ray and the groups of worker actors (``cluster``), and the driver side of a backend or engine made of such workers
(``driver``)."""
