"""Job kinds that exist for the tests: each registered as a product kind is, in one line
(``kernels.registry.add_kind_modules("tests.kinds.<name>")``, or ``GPUEST_EXTRA_KIND_MODULES`` for a process)."""
