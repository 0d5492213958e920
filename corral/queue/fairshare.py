"""Moved to `corral.tenancy.fairshare`; its names stay importable here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.fairshare import (
    _LN2 as _LN2,
)
from corral.tenancy.fairshare import (
    _REBASE as _REBASE,
)
from corral.tenancy.fairshare import (
    RESOURCES as RESOURCES,
)
from corral.tenancy.fairshare import (
    FloatArray as FloatArray,
)
from corral.tenancy.fairshare import (
    Offer as Offer,
)
from corral.tenancy.fairshare import (
    ShareRow as ShareRow,
)
from corral.tenancy.fairshare import (
    T as T,
)
from corral.tenancy.fairshare import (
    UsageLedger as UsageLedger,
)
from corral.tenancy.fairshare import (
    amount as amount,
)
from corral.tenancy.fairshare import (
    check_half_life as check_half_life,
)
from corral.tenancy.fairshare import (
    decayed_capacity as decayed_capacity,
)
from corral.tenancy.fairshare import (
    dominant_share as dominant_share,
)
from corral.tenancy.fairshare import (
    expected_usage as expected_usage,
)
from corral.tenancy.fairshare import (
    fair_order as fair_order,
)
from corral.tenancy.fairshare import (
    held as held,
)
from corral.tenancy.fairshare import (
    running_usage as running_usage,
)
from corral.tenancy.fairshare import (
    share_rows as share_rows,
)
