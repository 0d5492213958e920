"""The environment of a job that no shell submitted: a definition's run, a service's instance.

`corral submit` sends the submitter's own environment; a scheduled run or a service instance has only what its
definition names, so it starts from what a login would give its user (HOME, USER, LOGNAME, SHELL) and the daemon's
PATH, the machine's tools as the administrator set them up (as a Mesos agent passes its environment to tasks), then
the definition's variables on top.
"""

from __future__ import annotations

import os
import pwd

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
