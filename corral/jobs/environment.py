"""The environment a job inherits.

A job submitted with `corral submit` (or `POST /v1/jobs`) gets the submitter's environment, as Slurm's default
`--export=ALL` does, minus what `admitted_environment` drops: corral's own variables (`CORRAL_*`: the client's
settings and credentials, `CORRAL_TOKEN` above all) and a short deny-list of variables that hand over the submitting
login session's powers (its ssh and gpg agents). Both the CLI (before it sends) and the server (at admission, for any
client) apply the rule, so a token never reaches the store, the job, or an API answer. A deny-list and not an
allow-list: a batch job needs the user's PATH, virtualenv, CUDA and framework variables, which no fixed list names.
The executor then sets its own variables on top (CORRAL_JOB_ID, CUDA_VISIBLE_DEVICES ...).

A scheduled run or a service instance has no submitting shell: it has only what its definition names, so it starts
from what a login would give its user (HOME, USER, LOGNAME, SHELL) and the daemon's PATH, the machine's tools as the
administrator set them up (as a Mesos agent passes its environment to tasks), then the definition's variables on top.
"""

from __future__ import annotations

import os
import pwd

TYPE_CHECKING = False  # typing's, without importing collections: `corral submit`'s fast path imports this module
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Prefix of corral's own variables: client settings and credentials, never a job's (any case: `corral_token` too).
CORRAL_PREFIX = "CORRAL_"
#: Variables of the submitting login session that grant its powers to whoever holds them: a forwarded ssh agent, a
#: gpg agent. A job may start hours later, after the login is gone; it gets its own credentials, not the session's.
SESSION_VARIABLES = frozenset({"SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO"})


#: Names the rule below; a store scrubbed under it is not scanned again (change it whenever the rule changes).
RULE = "corral-env-1: no CORRAL_*, no SSH_AUTH_SOCK, SSH_AGENT_PID, GPG_AGENT_INFO"


def is_denied(name: str) -> bool:
    """Whether a submitted variable is dropped at admission (corral's own, or a login session's agent)."""
    return name.upper().startswith(CORRAL_PREFIX) or name in SESSION_VARIABLES


def admitted_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a submitter's environment that is stored with a job and given to it (see the module's rule)."""
    return {name: value for name, value in env.items() if not is_denied(name)}


def base_environment(uid: int, user: str) -> tuple[dict[str, str], str]:
    """(environment, home directory) for a job of `uid`; home is "/" when the user has none here."""
    home, shell = "/", "/bin/sh"
    try:
        entry = pwd.getpwuid(uid)
        if os.path.isdir(entry.pw_dir):
            home = entry.pw_dir
        shell = entry.pw_shell or shell
    except KeyError:
        pass
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": shell,
    }
    for name in ("LANG", "LC_ALL", "TZ"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env, home
