"""pgrag's lab: what demonstrates and measures pgrag, apart from the product.

The sample shop (``sample``, ``sample_documents``), the demo, the evaluation (``eval``), the
parameter sweeps and the synthetic stores the benchmarks use. The lab depends on the core
(``pgrag.*``); the core never imports the lab (tests/test_architecture.py checks it).
"""
