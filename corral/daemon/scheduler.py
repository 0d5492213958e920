"""Moved to `corral.tenancy.round` (serve's pass is tenancy's round, shared by every face)."""

from corral.tenancy.round import (
    Plan as Plan,
)
from corral.tenancy.round import (
    ShapeCache as ShapeCache,
)
from corral.tenancy.round import (
    Start as Start,
)
from corral.tenancy.round import (
    clock_text as clock_text,
)
from corral.tenancy.round import (
    request_of as request_of,
)
from corral.tenancy.round import (
    schedule as schedule,
)
