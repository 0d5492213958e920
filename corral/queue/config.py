"""Moved to `corral.tenancy.config`; its names stay importable from here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.config import (
    _MAX as _MAX,
)
from corral.tenancy.config import (
    _SCAN as _SCAN,
)
from corral.tenancy.config import (
    DEFAULT_HALF_LIFE_S as DEFAULT_HALF_LIFE_S,
)
from corral.tenancy.config import (
    DEFAULT_MIN_RUNTIME_S as DEFAULT_MIN_RUNTIME_S,
)
from corral.tenancy.config import (
    DEFAULT_QUEUE as DEFAULT_QUEUE,
)
from corral.tenancy.config import (
    DIMENSIONS as DIMENSIONS,
)
from corral.tenancy.config import (
    MAX_DEPTH as MAX_DEPTH,
)
from corral.tenancy.config import (
    MAX_FILE_BYTES as MAX_FILE_BYTES,
)
from corral.tenancy.config import (
    MAX_MIN_RUNTIME_S as MAX_MIN_RUNTIME_S,
)
from corral.tenancy.config import (
    MAX_PRINCIPALS as MAX_PRINCIPALS,
)
from corral.tenancy.config import (
    MAX_QUEUES as MAX_QUEUES,
)
from corral.tenancy.config import (
    MAX_TABLES as MAX_TABLES,
)
from corral.tenancy.config import (
    MAX_WEIGHT as MAX_WEIGHT,
)
from corral.tenancy.config import (
    NAMES as NAMES,
)
from corral.tenancy.config import (
    Amounts as Amounts,
)
from corral.tenancy.config import (
    Principal as Principal,
)
from corral.tenancy.config import (
    QueueConfigError as QueueConfigError,
)
from corral.tenancy.config import (
    QueuesConfig as QueuesConfig,
)
from corral.tenancy.config import (
    QueueSpec as QueueSpec,
)
from corral.tenancy.config import (
    Vector as Vector,
)
from corral.tenancy.config import (
    _check_counts as _check_counts,
)
from corral.tenancy.config import (
    _Reader as _Reader,
)
from corral.tenancy.config import (
    check_bounds as check_bounds,
)
from corral.tenancy.config import (
    load_queues as load_queues,
)
from corral.tenancy.config import (
    parse_queues as parse_queues,
)
from corral.tenancy.config import (
    validate_against_machine as validate_against_machine,
)
from corral.tenancy.config import (
    vector_value as vector_value,
)
