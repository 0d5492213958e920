"""Moved to `corral.tenancy.quota`; its names stay importable from here for code not yet changed (docs/tenancy.md)."""

from corral.tenancy.quota import (
    ZERO as ZERO,
)
from corral.tenancy.quota import (
    Gate as Gate,
)
from corral.tenancy.quota import (
    GroupsOf as GroupsOf,
)
from corral.tenancy.quota import (
    Usage as Usage,
)
from corral.tenancy.quota import (
    _id_order as _id_order,
)
from corral.tenancy.quota import (
    add as add,
)
from corral.tenancy.quota import (
    amount_text as amount_text,
)
from corral.tenancy.quota import (
    ask_text as ask_text,
)
from corral.tenancy.quota import (
    below_guarantee as below_guarantee,
)
from corral.tenancy.quota import (
    borrowing as borrowing,
)
from corral.tenancy.quota import (
    demand as demand,
)
from corral.tenancy.quota import (
    free_of as free_of,
)
from corral.tenancy.quota import (
    held as held,
)
from corral.tenancy.quota import (
    measure as measure,
)
from corral.tenancy.quota import (
    over as over,
)
from corral.tenancy.quota import (
    queue_rows as queue_rows,
)
from corral.tenancy.quota import (
    shown as shown,
)
