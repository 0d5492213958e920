"""Moved to `corral.tenancy.preemption` (preemption planning is tenancy's, shared by every face)."""

from corral.tenancy.preemption import (
    DEFAULT_GRACE_S as DEFAULT_GRACE_S,
)
from corral.tenancy.preemption import (
    PREEMPTING as PREEMPTING,
)
from corral.tenancy.preemption import (
    Choice as Choice,
)
from corral.tenancy.preemption import (
    Rules as Rules,
)
from corral.tenancy.preemption import (
    choose as choose,
)
from corral.tenancy.preemption import (
    protected as protected,
)
from corral.tenancy.preemption import (
    span_text as span_text,
)
