"""Moved to `corral.tenancy.reservation` (the head's reservation is tenancy's, shared by every face)."""

from corral.tenancy.reservation import (
    DEFAULT_TIME_LIMIT_S as DEFAULT_TIME_LIMIT_S,
)
from corral.tenancy.reservation import (
    Booking as Booking,
)
from corral.tenancy.reservation import (
    Reservation as Reservation,
)
from corral.tenancy.reservation import (
    book as book,
)
from corral.tenancy.reservation import (
    expected_end as expected_end,
)
from corral.tenancy.reservation import (
    intersect as intersect,
)
