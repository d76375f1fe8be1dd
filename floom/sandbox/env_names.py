"""Which environment variable names a worker may give its process: the one rule for secret
names, worker.yml and the sandbox's environment.

Refused are the names that change how a program loads or runs rather than what it reads:
the dynamic loader's and the C library's, those of the shells and language runtimes that
make them load or run other code, and floom's own (the values it sets in every run). A
secret under such a name would act on every program of the run (in a host process, on the
host), so it is refused where the name is given (`floom secrets set`, REST, MCP, worker.yml
at validate and deploy), and a sandbox refuses it too, as the last line.
"""

from __future__ import annotations

from typing import Final

# (prefix, why): a name starting with the prefix is refused.
_PREFIXES: Final = (
    ("LD_", "the dynamic loader reads LD_* variables to load code into every program"),
    ("DYLD_", "the dynamic loader reads DYLD_* variables to load code into every program"),
    ("MALLOC_", "the C library's allocator reads MALLOC_* variables (traces, checks)"),
    ("GLIBC_", "the C library reads GLIBC_* variables (tunables) in every program"),
    ("PYTHON", "Python reads PYTHON* variables to choose its paths, startup file and options"),
    ("PERL5", "Perl reads PERL5* variables to load libraries and options"),
    ("RUBY", "Ruby reads RUBY* variables to load libraries and options"),
    ("LUA_", "Lua reads LUA_* variables to load libraries and startup code"),
    ("BASH_FUNC_", "bash imports functions from BASH_FUNC_* variables"),
    ("FLOOM_", "floom sets FLOOM_* variables itself in every run"),
    (
        "OPENSSL_",
        "OpenSSL reads OPENSSL_* variables to load its configuration, engines and "
        "providers (code) in every program that uses it",
    ),
    (
        "GIT_CONFIG",
        "git reads GIT_CONFIG* variables as configuration, which can name commands for it to run",
    ),
    (
        "NPM_CONFIG_",
        "npm reads npm_config_* variables as configuration (the shell for "
        "scripts, Node.js options)",
    ),
)
# name -> why.
_NAMES: Final = {
    **dict.fromkeys(
        (
            "GCONV_PATH",
            "GETCONF_DIR",
            "HOSTALIASES",
            "LOCALDOMAIN",
            "LOCPATH",
            "NIS_PATH",
            "NLSPATH",
            "RESOLV_HOST_CONF",
            "RES_OPTIONS",
            "TMPDIR",
            "TZDIR",
        ),
        "the C library reads it to load files or modules in every program (glibc drops it "
        "for privileged programs for that reason)",
    ),
    **dict.fromkeys(
        ("BASH_ENV", "ENV", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "GLOBIGNORE"),
        "shells read it to run startup code or to change how they read commands",
    ),
    **dict.fromkeys(
        ("PROMPT_COMMAND", "SHELL", "TERMINFO", "TERMINFO_DIRS"),
        "programs read it to choose a program or file to load",
    ),
    **dict.fromkeys(
        ("NODE_OPTIONS", "NODE_PATH", "NODE_REPL_EXTERNAL_MODULE"),
        "Node.js reads it to load modules and options",
    ),
    **dict.fromkeys(
        ("PERLLIB", "PERLDB_OPTS", "PERLIO"), "Perl reads it to load libraries and options"
    ),
    **dict.fromkeys(
        ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH"),
        "Java reads it to load agents, classes and options",
    ),
    **dict.fromkeys(
        (
            "TCLLIBPATH",
            "PHPRC",
            "PHP_INI_SCAN_DIR",
            "GEM_HOME",
            "GEM_PATH",
            "R_PROFILE",
            "R_PROFILE_USER",
            "R_ENVIRON",
            "R_ENVIRON_USER",
            "R_LIBS",
            "R_LIBS_USER",
        ),
        "an interpreter loads code from it",
    ),
    **dict.fromkeys(
        (
            "GIT_SSH",
            "GIT_SSH_COMMAND",
            "GIT_EXEC_PATH",
            "GIT_ASKPASS",
            "GIT_PROXY_COMMAND",
            "GIT_EXTERNAL_DIFF",
            "GIT_PAGER",
            "GIT_EDITOR",
            "GIT_TEMPLATE_DIR",
            "PAGER",
            "MANPAGER",
            "EDITOR",
            "VISUAL",
            "BROWSER",
            "LESSOPEN",
            "LESSCLOSE",
            "SSH_ASKPASS",
            "SUDO_ASKPASS",
            "GOFLAGS",
            "RUSTC_WRAPPER",
        ),
        "programs run the command (or load the code) it names",
    ),
    **dict.fromkeys(
        (
            "GTK_MODULES",
            "GTK_PATH",
            "GIO_EXTRA_MODULES",
            "GST_PLUGIN_PATH",
            "GST_PLUGIN_SYSTEM_PATH",
            "QT_PLUGIN_PATH",
            "LIBGL_DRIVERS_PATH",
            "SASL_PATH",
            "KRB5_CONFIG",
        ),
        "a library loads plugins (code) from where it points",
    ),
    **dict.fromkeys(
        ("ZDOTDIR", "INPUTRC", "TERMCAP", "BASH_LOADABLES_PATH", "BASH_XTRACEFD"),
        "shells read it to run startup code or to change how they read commands",
    ),
    "SSLKEYLOGFILE": "TLS libraries write every connection's keys to the file it names",
    **dict.fromkeys(
        ("PATH", "HOME", "LANG", "PWD", "OLDPWD"),
        "floom sets it itself in every run's environment",
    ),
}
RUN_VARIABLES: Final = frozenset(
    {
        "FLOOM_RUN_ID",
        "FLOOM_ATTEMPT",
        "FLOOM_WORKER",
        "FLOOM_VERSION_ID",
        "FLOOM_PHASE",
        "FLOOM_PREVIOUS_ATTEMPT",
        "FLOOM_OUTPUT_DIR",
    }
)
"""The FLOOM_* values floom itself gives a run's process (the only refused names a sandbox's
environment may hold)."""
REFUSED_SUMMARY: Final = (
    ", ".join(f"{prefix}*" for prefix, _why in _PREFIXES) + ", " + ", ".join(sorted(_NAMES))
)
"""Every refused name and prefix, for errors and the docs (docs/explanation/security-model.md)."""


def refusal(name: str) -> str | None:
    """Why `name` may not name a secret or a worker's environment variable; None when it
    may. Compared in upper case, so no spelling of a refused name passes."""
    upper = name.upper()
    for prefix, why in _PREFIXES:
        if upper.startswith(prefix):
            return f"{name} is refused: {why}"
    named = _NAMES.get(upper)
    return None if named is None else f"{name} is refused: {named}"


MAX_ENTRY_BYTES: Final = 128 * 1024 - 1
"""The longest `NAME=value` a process's environment holds (the kernel's MAX_ARG_STRLEN, its
NUL included)."""


RENAME_HINT: Final = (
    "choose another name (e.g. prefixed with your service: MYAPP_PATH); refused are "
    + REFUSED_SUMMARY
)
