"""gpuest api.

The kinds the API serves are the registry's plus those of ``GPUEST_EXTRA_KIND_MODULES``, registered here, on the
package's import, before any router reads the registry (the routers' request models are built from it)."""

from core.settings import Settings
from kernels.registry import add_kind_modules

add_kind_modules(*Settings().extra_kind_modules)  # not the cached settings: a test's environment comes later
