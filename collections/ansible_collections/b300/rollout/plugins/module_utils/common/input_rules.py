"""Value rules for every input of the sglang role that reaches a host (pure, stdlib only; issue 23).

One place for what a value must survive on its way to a host: an HTTP header (the API key as a Bearer token), a
systemd unit file (paths and names written without quoting, `%` specifiers), an env file (systemd's parser), an
argv (ExecStart=, quoted by sglang_plan.systemd_quote), a URL, a port, a number or a boolean given as a string.
These are RULES (character classes, shapes, ranges), never lists of known bad strings.

    problems = check_role_inputs(values, host="b300a")       # {variable: value} of the role's variables
    problems += check_host_inputs("b300a", host_values)      # sglang_advertise_address, sglang_instance_overrides
    problems += check_profile("kimi_k3", profile_data)       # the profile file itself (args, env, ports)

Each problem is one line: `<host>: <variable>: <what was found>; rule: <the rule>; fix: <how to fix it>`. A secret's
value is never shown (only its length and the position and class of an offending character); neither is the value
of an environment variable whose name says it is a secret (…KEY, …TOKEN, …SECRET, …PASSWORD).
"""

import ipaddress
import posixpath
import re
import unicodedata

# --- character classes -------------------------------------------------------------------------------------------
# RFC 7235 section 2.1 token68 (the credentials of `Authorization: Bearer <token>`, RFC 6750 section 2.1):
#   token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
TOKEN68_RE = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
TOKEN68_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/")
SECRET_MIN_LEN = 16
SECRET_MAX_LEN = 256
# Paths written into unit files WITHOUT quoting (WorkingDirectory=, ReadWritePaths=, EnvironmentFile=, the launcher in
# ExecStart=, ExecStartPre=) and into command strings: POSIX portable file name characters plus `+` and `@`.
UNIT_PATH_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/+@")
# Paths that reach the host only as one quoted argv element (ExecStart= through sglang_plan.systemd_quote, which
# escapes %, $, " and \; JSON; shell-quoted script arguments): printable ASCII, but no quotes, backslash or backtick.
ARGV_PATH_FORBIDDEN = frozenset("\"'\\`")
# Env file values (KEY=VALUE lines read by systemd's EnvironmentFile= parser, unquoted): quotes and backslashes are its
# syntax; $ and ` are expanded by any shell that sources the file.
ENV_VALUE_FORBIDDEN = frozenset("\"'\\$`")
# Environment= values written into the unit file itself, unquoted: also no space (separates assignments) and no %
# (a systemd specifier).
UNIT_ENV_VALUE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/+@,:=")

NAME_RES = {
    # a word of a unit name (<prefix>-<profile>-<instance>.service): systemd unit name characters minus the ones with a
    # meaning there ("@" template, "." suffix, "\" escape, ":")
    "unit_word": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"),
                  "letters, digits, '_' and '-', starting with a letter or digit, at most 64 characters"),
    # a profile is a file name under roles/sglang/files/profiles/
    "profile": (re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$"),
                "lower-case letters, digits and '_' (a file name in roles/sglang/files/profiles/, no '/' or '.')"),
    # Debian's useradd/groupadd NAME_REGEX (adduser.conf), at most 32 characters
    "posix_name": (re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"),
                   "a POSIX user/group name: lower-case letters, digits, '_' and '-', starting with a letter or '_', "
                   "at most 32 characters"),
    "unit": (re.compile(r"^[A-Za-z0-9_.@:-]{1,250}\.(service|target|socket|mount|path|timer|device)$"),
             "a systemd unit name (letters, digits, '_', '.', '@', ':', '-') with its type suffix, e.g. foo.service"),
    "env_name": (re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"),
                 "an environment variable name: letters, digits and '_', not starting with a digit"),
    "package": (re.compile(r"^[a-z0-9][a-z0-9+.-]{0,127}$"),
                "a Debian package name: lower-case letters, digits, '+', '.' and '-'"),
    "pip_name": (re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$"),
                 "a Python distribution name (PEP 508: letters, digits, '.', '_', '-')"),
    "pip_requirement": (re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(==[A-Za-z0-9.+!_-]+)?$"),
                        "a pinned requirement NAME==VERSION (or a bare NAME)"),
    "ib_device": (re.compile(r"^[A-Za-z0-9_.-]{1,64}$"), "an RDMA device name such as mlx5_0"),
    "flag": (re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$"), "a long option such as --log-level"),
    "instance": (re.compile(r"^[A-Z][A-Z]*[0-9]+$"), "an instance name such as W0, P1, D0"),
}
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
PIP_VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SIZE_RE = re.compile(r"^\d+[KMGTPE]?$")
TIMESPAN_RE = re.compile(r"^(\d+(us|ms|s|sec|m|min|h|hr|d|day|days|w|week|weeks|month|months|y|year|years)?)"
                         r"( \d+(us|ms|s|sec|m|min|h|hr|d|day|days|w|week|weeks|month|months|y|year|years)?)*$")
DEVICE_ALLOW_RE = re.compile(r"^((char|block)-[A-Za-z0-9_*.-]+|/dev/[A-Za-z0-9_./-]+)( [rwm]{1,3})?$")
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
BOOL_STRINGS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
INSTANCE_OVERRIDE_KEYS = ("gpus", "ib_devices", "port", "nccl_port", "bootstrap_port", "args", "env")


class Refusal(Exception):
    """A value that breaks a rule: what was found, the rule, the fix."""

    def __init__(self, found, rule, fix):
        super().__init__(found)
        self.found, self.rule, self.fix = found, rule, fix


# --- describing values without leaking them ------------------------------------------------------------------------
def char_class(ch):
    """Words for one character (used for secrets: the class, never the character)."""
    if ch in "\n\r":
        return "a line break (%s)" % ("newline" if ch == "\n" else "carriage return")
    if ch == "\t":
        return "a tab"
    if ch == " ":
        return "a space"
    if ord(ch) < 32 or ord(ch) == 127:
        return "a control character (U+%04X)" % ord(ch)
    if ord(ch) > 127:
        cat = unicodedata.category(ch)
        if cat.startswith("Z"):
            return "a non-ASCII space (U+%04X)" % ord(ch)
        if cat in ("Cf", "Cc", "Co", "Cn", "Cs"):
            return "an invisible non-ASCII character (U+%04X)" % ord(ch)
        return "a non-ASCII character"
    return None


def show(value):
    """A value for a message: repr-like, control characters escaped, long values shortened."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("unicode_escape").decode("ascii") if isinstance(value, str) else text
    if len(text) > 120:
        text = text[:100] + "...(%d characters)" % len(text)
    return "'%s'" % text if isinstance(value, str) else text


def _bad_char(value, allowed=None, forbidden=None, ascii_only=True):
    """(index, char) of the first character outside the class, or None."""
    for i, ch in enumerate(value):
        if ord(ch) < 32 or ord(ch) == 127:
            return i, ch
        if ascii_only and ord(ch) > 126:
            return i, ch
        if not ascii_only and ord(ch) > 126 and (unicodedata.category(ch)[0] in "CZ"):
            return i, ch
        if allowed is not None and ch not in allowed:
            return i, ch
        if forbidden is not None and ch in forbidden:
            return i, ch
    return None


def _describe(ch):
    return char_class(ch) or "%r" % ch


def _type_name(value):
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a mapping",
            type(None): "empty (null)"}.get(type(value), type(value).__name__)


# --- rules: each returns None or raises Refusal -------------------------------------------------------------------
def rule_secret(value, optional=True, min_len=SECRET_MIN_LEN, max_len=SECRET_MAX_LEN):
    """An API key sent as `Authorization: Bearer <key>` (router health checks, clients, the role's own calls)."""
    rule = ("a Bearer token (RFC 6750/7235 token68: letters, digits and - . _ ~ + /, '=' only at the end), "
            "%d-%d characters, no whitespace or control characters" % (min_len, max_len))
    fix = ("generate one with `openssl rand -hex 32` and keep it in ansible-vault; a key read from a file keeps its "
           "trailing newline (strip it: `| trim`)")
    if value is None or (isinstance(value, str) and value == ""):
        if optional:
            return
        raise Refusal("empty", rule, fix)
    if not isinstance(value, str):
        raise Refusal("%s, not a string (value not shown)" % _type_name(value), rule,
                      "quote it in YAML so it stays a string; " + fix)
    where = "(secret, value not shown: %d characters)" % len(value)
    for i, ch in enumerate(value):
        what = char_class(ch)
        if what:
            raise Refusal("%s holds %s at character %d" % (where, what, i + 1), rule, fix)
    stripped = value.rstrip("=")
    if not stripped:
        raise Refusal("%s is only '=' padding" % where, rule, fix)
    for i, ch in enumerate(stripped):
        if ch not in TOKEN68_CHARS:
            extra = " ('=' is padding, allowed only at the end)" if ch == "=" else ""
            raise Refusal("%s holds a character outside the token alphabet at character %d%s" % (where, i + 1, extra),
                          rule, fix)
    if not min_len <= len(value) <= max_len:
        raise Refusal("%s is %s" % (where, "too short" if len(value) < min_len else "too long"), rule, fix)


def _path_common(value, rule, fix, required=True):
    if value is None or value == "":
        if required:
            raise Refusal("empty", rule, "set it to an absolute path")
        return False
    if not isinstance(value, str):
        raise Refusal("%s %s, not a string" % (_type_name(value), show(value)), rule, "set it to an absolute path")
    if value != value.strip():
        raise Refusal("%s has leading or trailing whitespace" % show(value), rule, "remove the whitespace")
    if not value.startswith("/"):
        raise Refusal("%s is not an absolute path" % show(value), rule, "write the full path from /")
    parts = value.rstrip("/").split("/")[1:]
    if any(p in (".", "..") for p in parts) or "//" in value:
        raise Refusal("%s is not a normalized path ('.', '..' or '//')" % show(value), rule,
                      "write it as %s" % posixpath.normpath(value))
    return True


def rule_argv_path(value, required=True):
    """An absolute path that reaches the host only as one quoted argument (ExecStart=, JSON, shell-quoted)."""
    rule = ("an absolute, normalized path of printable ASCII without quotes, backslash or backtick "
            "(spaces, % and $ are fine: the unit quotes and escapes them)")
    fix = "rename the directory or point a symlink with a plain ASCII name at it"
    if not _path_common(value, rule, fix, required):
        return
    bad = _bad_char(value, forbidden=ARGV_PATH_FORBIDDEN)
    if bad:
        raise Refusal("%s holds %s at character %d" % (show(value), _describe(bad[1]), bad[0] + 1), rule, fix)


def rule_unit_path(value, required=True):
    """An absolute path written into unit files or command strings WITHOUT quoting."""
    rule = ("an absolute, normalized path of letters, digits and . _ - + @ / only (it is written into unit files "
            "unquoted: a space splits it, % is a systemd specifier, $ and quotes are syntax)")
    fix = "use a path of those characters (a symlink to the real location works)"
    if not _path_common(value, rule, fix, required):
        return
    bad = _bad_char(value, allowed=UNIT_PATH_CHARS)
    if bad:
        raise Refusal("%s holds %s at character %d" % (show(value), _describe(bad[1]), bad[0] + 1), rule, fix)


def rule_systemd_dir(value, base):
    """StateDirectory=/CacheDirectory= take a name under /var/lib or /var/cache: the path must be exactly base/NAME."""
    rule_unit_path(value)
    name = value.rstrip("/")[len(base) + 1:] if value.startswith(base + "/") else ""
    if not name or "/" in name:
        raise Refusal("%s is not a directory directly under %s" % (show(value), base),
                      "%s/NAME: the unit's %s= creates %s/<basename> and the service runs there"
                      % (base, "StateDirectory" if base == "/var/lib" else "CacheDirectory", base),
                      "use %s/%s" % (base, posixpath.basename(value.rstrip("/")) or "sglang"))


def rule_name(value, kind, required=True):
    regex, rule = NAME_RES[kind]
    if value is None or value == "":
        if required:
            raise Refusal("empty", rule, "set a value")
        return
    if not isinstance(value, str):
        raise Refusal("%s %s, not a string" % (_type_name(value), show(value)), rule, "write it as a string")
    if not regex.match(value):
        bad = _bad_char(value)
        detail = " (%s at character %d)" % (_describe(bad[1]), bad[0] + 1) if bad else ""
        raise Refusal("%s is not %s%s" % (show(value), rule.split(":")[0], detail), rule,
                      "write it with those characters only")


def rule_not_root(value, what):
    rule_name(value, "posix_name")
    if value == "root":
        raise Refusal("'root'", "a dedicated unprivileged %s (the services never run as root, and the env files holding "
                      "the API key are readable by that group only)" % what, "use the role default 'sglang'")


def _ip(value):
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def rule_bind_address(value):
    rule = "an IP address literal to listen on (0.0.0.0 or :: for every address, or one of the host's addresses)"
    if not isinstance(value, str) or value == "":
        raise Refusal("empty" if value in (None, "") else "%s %s" % (_type_name(value), show(value)), rule,
                      "set e.g. 0.0.0.0")
    if value != value.strip() or _ip(value) is None:
        raise Refusal("%s is not an IP address" % show(value), rule, "write a plain IPv4/IPv6 address, no port or "
                      "prefix length")


def rule_advertise_address(value):
    rule = ("the host's data-network address that the other host and the router reach: an IP address or DNS name, "
            "not loopback, unspecified, multicast or link-local")
    fix = "set sglang_advertise_address to this host's data-network IP in inventory/production/hosts.yml"
    if not isinstance(value, str) or value == "":
        raise Refusal("empty" if value in (None, "") else "%s %s" % (_type_name(value), show(value)), rule, fix)
    ip = _ip(value)
    if ip is None:
        if value != value.strip() or not HOSTNAME_RE.match(value) or value.replace(".", "").isdigit():
            raise Refusal("%s is neither an IP address nor a DNS name" % show(value), rule, fix)
        if value.lower() == "localhost" or value.lower().startswith("localhost."):
            raise Refusal("%s is the loopback name" % show(value), rule, fix)
        return
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        kind = ("a loopback" if ip.is_loopback else "an unspecified" if ip.is_unspecified
                else "a multicast" if ip.is_multicast else "a link-local")
        raise Refusal("%s is %s address" % (show(value), kind), rule, fix)


def rule_port(value):
    rule = "a TCP port: a number 1-65535 (YAML/JSON number, not a string)"
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            raise Refusal("%s is a string" % show(value), rule, "write it without quotes: %s" % value.strip())
        raise Refusal("%s %s" % (_type_name(value), show(value)), rule, "write a number 1-65535")
    if not 1 <= value <= 65535:
        raise Refusal("%d is out of range" % value, rule, "write a number 1-65535")


def to_int(value):
    """An integer given as a number or as a decimal string (what -e name=value passes); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.match(r"^[0-9]+$", value):
        return int(value)
    return None


def rule_int(value, minimum=1, maximum=None, unit="seconds"):
    rule = "a whole number of %s >= %d%s (a number, or digits only when given as a string, e.g. -e name=30)" % (
        unit, minimum, "" if maximum is None else " and <= %d" % maximum)
    n = to_int(value)
    if n is None:
        given = _type_name(value) if not isinstance(value, str) else "string"
        raise Refusal("%s %s is not a whole number" % (given, show(value)), rule,
                      "write digits only: no sign, unit, decimal point or spaces")
    if n < minimum or (maximum is not None and n > maximum):
        raise Refusal("%d is out of range" % n, rule, "use a value in the range")


def to_bool(value):
    """True/False for a boolean or one of the strings Ansible's bool filter reads; None otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in BOOL_STRINGS and value == value.strip():
        return BOOL_STRINGS[value.lower()]
    return None


def rule_bool(value):
    if to_bool(value) is None:
        raise Refusal("%s %s is not a boolean" % (_type_name(value) if not isinstance(value, str) else "string",
                                                  show(value)),
                      "true or false (as a -e string also yes/no, on/off, 1/0); any other text would silently mean "
                      "false", "write true or false")


def rule_text(value, required=True):
    """Text sent in a JSON body or as a quoted argument (prompts): printable, no control characters."""
    rule = "printable text without control characters (newlines, tabs, escapes), not empty"
    if value is None or value == "":
        if required:
            raise Refusal("empty", rule, "set a short sentence")
        return
    if not isinstance(value, str):
        raise Refusal("%s %s" % (_type_name(value), show(value)), rule, "write it as a string")
    bad = _bad_char(value, ascii_only=False)
    if bad:
        raise Refusal("%s holds %s at character %d" % (show(value), _describe(bad[1]), bad[0] + 1), rule,
                      "remove it")


def rule_version(value, regex=VERSION_RE, example="0.5.18", optional=True):
    rule = "empty (the pin) or an exact version such as %s" % example
    if value in ("", None) and optional:
        return
    text = value if isinstance(value, str) else None
    if text is None or not regex.match(text):
        raise Refusal("%s is not an exact version" % show(value), rule, "write the version, e.g. %s" % example)


def rule_url(value, optional=True):
    rule = "an http(s) URL of a directory listing, without user:password@ (credentials would land in pip's argv " \
           "and the output), or file:///ABSOLUTE/DIR (a directory on the host), without whitespace or control " \
           "characters"
    if value in ("", None) and optional:
        return
    if not isinstance(value, str):
        raise Refusal("%s %s" % (_type_name(value), show(value)), rule, "write the URL as a string")
    m = re.match(r"^(https?)://([^/?#]*)(.*)$", value)
    if not m and not re.match(r"^file:///[^/]", value):
        raise Refusal("%s is neither an http(s) URL nor file:///ABSOLUTE/DIR" % show(value), rule,
                      "write http://HOST[:PORT]/PATH or file:///DIR")
    if m and "@" in m.group(2):
        raise Refusal("the URL carries credentials (user:password@, value not shown)", rule,
                      "serve the wheelhouse without authentication on the private network, or set credentials in "
                      "the hosts' pip configuration")
    bad = _bad_char(value)
    if bad or " " in value:
        ch = bad[1] if bad else " "
        raise Refusal("%s holds %s" % (show(value), _describe(ch)), rule, "percent-encode it or remove it")


def rule_size(value, allow_infinity=False):
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    ok = isinstance(text, str) and (SIZE_RE.match(text) or (allow_infinity and text == "infinity"))
    if not ok:
        raise Refusal("%s is not a size" % show(value), "digits with an optional K/M/G/T/P/E suffix%s"
                      % (", or infinity" if allow_infinity else ""), "e.g. 32G%s" % (" or infinity" if allow_infinity
                                                                                     else ""))


def rule_nofile(value):
    if value == "infinity":
        return
    rule_int(value, minimum=1024, unit="open files")


def rule_timespan(value):
    if not isinstance(value, str) or not TIMESPAN_RE.match(value):
        raise Refusal("%s is not a systemd time span" % show(value), "a systemd time span such as 1month, 2w, 30d",
                      "write e.g. 1month")


def rule_device_allow(value):
    if not isinstance(value, str) or not DEVICE_ALLOW_RE.match(value):
        raise Refusal("%s is not a DeviceAllow= entry" % show(value),
                      "char-CLASS, block-CLASS or /dev/PATH, then optionally a space and r/w/m",
                      "write e.g. 'char-nvidia rw'")


def rule_env_value(value, secret=False, in_unit=False):
    """A value written as KEY=VALUE into an env file (or, in_unit, as Environment=KEY=VALUE into the unit file)."""
    if in_unit:
        rule = ("letters, digits and . _ - / + @ , : = only: it is written into the unit file unquoted (a space "
                "separates assignments, % is a systemd specifier, quotes and $ are syntax)")
    else:
        rule = ("printable ASCII without quotes, backslash, $ or backtick, no leading/trailing spaces (systemd's "
                "env-file parser treats quotes and backslashes as syntax and strips outer spaces)")
    fix = "use a value of those characters"
    if value is None or isinstance(value, bool) or isinstance(value, (list, dict)):
        raise Refusal("%s %s" % (_type_name(value), "(value not shown)" if secret else show(value)),
                      "a string or number: " + rule, "write it as a quoted string, e.g. \"1\"")
    text = str(value)
    shown = "(secret, value not shown)" if secret else show(text)
    if text != text.strip():
        raise Refusal("%s has leading or trailing whitespace" % shown, rule, "remove it")
    bad = _bad_char(text, allowed=UNIT_ENV_VALUE_CHARS) if in_unit else _bad_char(text, forbidden=ENV_VALUE_FORBIDDEN)
    if bad:
        what = (char_class(bad[1]) or "a character outside the allowed set") if secret else _describe(bad[1])
        raise Refusal("%s holds %s at character %d" % (shown, what, bad[0] + 1), rule, fix)


def rule_arg_value(value):
    """A flag value: one element of the ExecStart= argv (quoted and escaped by sglang_plan.systemd_quote)."""
    rule = ("a string, number or boolean (a list for multi-value flags) without control characters: it becomes "
            "one quoted argument on the ExecStart= line")
    if value is None or isinstance(value, (bool, int, float)):
        return
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, (bool, int, float)):
            continue
        if not isinstance(v, str):
            raise Refusal("%s %s" % (_type_name(v), show(v)), rule, "write a string or number")
        if v != v.strip():
            raise Refusal("%s has leading or trailing whitespace" % show(v), rule, "remove it")
        bad = _bad_char(v, ascii_only=False)
        if bad:
            raise Refusal("%s holds %s at character %d" % (show(v), _describe(bad[1]), bad[0] + 1), rule,
                          "remove it (a newline would end the ExecStart= line)")


def rule_instance_id(value):
    if not (isinstance(value, str) and re.match(r"^[A-Za-z0-9_.-]+/[A-Z]+[0-9]+$", value)):
        raise Refusal("%s is not an instance id" % show(value), "an instance id HOST/NAME such as b300a/W0",
                      "write HOST/NAME as the plan shows it")


def _manifest(value):
    if not isinstance(value, dict):
        raise Refusal("%s" % _type_name(value), "a mapping of absolute file path -> sha256 hex", "write {path: sha256}")
    for path, digest in value.items():
        rule_argv_path(path)
        if not isinstance(digest, str) or not SHA256_RE.match(digest):
            raise Refusal("the digest of %s is %s" % (show(path), show(digest)), "64 lower-case hex digits (sha256)",
                          "copy the output of sha256sum")


def _list_of(check):
    def run(value):
        if not isinstance(value, list):
            raise Refusal("%s %s" % (_type_name(value), show(value)), "a list", "write a YAML list")
        for i, item in enumerate(value):
            try:
                check(item)
            except Refusal as exc:
                raise Refusal("item %d: %s" % (i + 1, exc.found), exc.rule, exc.fix) from None
    return run


def _dict_shape(value):
    if not isinstance(value, dict):
        raise Refusal("%s %s" % (_type_name(value), show(value)), "a mapping (YAML dict / JSON object)",
                      "write it as a mapping, e.g. -e '{\"name\": {...}}'")


SPEC_CHOICES = ("a choice: `choices` in the role's meta/argument_specs.yml, which Ansible checks at the role's entry "
                "points with its own message (the variable, the value found, the choices)")
# variable -> check(value). Every variable of roles/sglang/defaults/main.yml is either here or in NOT_CHECKED
# (tests/unit/test_input_rules.py keeps the two in sync with the defaults).
ROLE_RULES = {
    "sglang_profile": lambda v: rule_name(v, "profile"),
    "sglang_profile_overrides": _dict_shape,
    "sglang_server_extra_args": _dict_shape,
    "sglang_server_extra_env": _dict_shape,
    "sglang_instance_overrides": _dict_shape,
    "sglang_version": rule_version,
    "sglang_versions": lambda v: (_dict_shape(v), [rule_version(x, optional=False) for x in v.values()]),
    "sglang_router_version": lambda v: rule_version(v, example="0.3.2"),
    "sglang_model_root": rule_argv_path,
    "sglang_model_check": rule_bool,
    "sglang_model_manifest": _manifest,
    "sglang_model_check_deferred": rule_bool,
    "sglang_model_size_tolerance_pct": lambda v: rule_int(v, 0, 100, unit="percent"),
    "sglang_host_memory_check": rule_bool,
    "sglang_host_memory_reserve_gib": lambda v: rule_int(v, 0, unit="GiB"),
    "sglang_disk_min_free_gib": lambda v: rule_int(v, 0, unit="GiB"),
    "sglang_require_advertise_address": rule_bool,
    "sglang_install_root": rule_unit_path,
    "sglang_server_executable": rule_argv_path,
    "sglang_server_install": rule_bool,
    "sglang_python": lambda v: rule_unit_path(v) if isinstance(v, str) and v.startswith("/") else rule_name(
        v, "pip_name"),
    "sglang_wheelhouse_dir": lambda v: rule_argv_path(v, required=False),
    "sglang_wheelhouse_url": rule_url,
    "sglang_wheelhouse_remote_dir": rule_unit_path,
    "sglang_pip_no_deps": rule_bool,
    "sglang_pip_only_binary": _list_of(lambda x: rule_name(x, "pip_name")),
    "sglang_pip_preinstall": lambda v: (_dict_shape(v), [_list_of(lambda x: rule_name(x, "pip_requirement"))(x)
                                                         for x in v.values()]),
    "sglang_mooncake_package": lambda v: rule_name(v, "pip_name"),
    "sglang_mooncake_remove_packages": _list_of(lambda x: rule_name(x, "pip_name")),
    "sglang_mooncake_version": lambda v: rule_version(v, PIP_VERSION_RE, "0.3.13.post1"),
    "sglang_install_rdma_packages": rule_bool,
    "sglang_rdma_packages": _list_of(lambda x: rule_name(x, "package")),
    "sglang_cuda_major": lambda v: (_dict_shape(v), [rule_int(x, 1, 99, unit="(CUDA major)") for x in v.values()]),
    "sglang_venv_check": rule_bool,
    "sglang_venv_check_libs": rule_bool,
    "sglang_system_packages": _list_of(lambda x: rule_name(x, "package")),
    "sglang_user": lambda v: rule_not_root(v, "user"),
    "sglang_group": lambda v: rule_not_root(v, "group"),
    "sglang_supplementary_groups": _list_of(lambda x: rule_name(x, "posix_name")),
    "sglang_env_dir": rule_unit_path,
    "sglang_state_dir": lambda v: rule_systemd_dir(v, "/var/lib"),
    "sglang_cache_dir": lambda v: rule_systemd_dir(v, "/var/cache"),
    "sglang_unit_prefix": lambda v: rule_name(v, "unit_word"),
    "sglang_bind_host": rule_bind_address,
    "sglang_api_key": rule_secret,
    "sglang_launcher_dir": rule_unit_path,
    "sglang_launcher_python": rule_unit_path,
    "sglang_start_timeout_s": rule_int,
    "sglang_stop_timeout_s": rule_int,
    "sglang_restart_sec": rule_int,
    "sglang_start_limit_burst": lambda v: rule_int(v, 1, unit="restarts"),
    "sglang_start_limit_interval_s": lambda v: rule_int(v, 0),
    "sglang_nvidia_bin_dir": rule_unit_path,
    "sglang_gpu_boot_services": _list_of(lambda x: rule_name(x, "unit")),
    "sglang_gpu_boot_check": rule_bool,
    "sglang_fabric_wait_timeout_s": rule_int,
    "sglang_modules_load_uvm": rule_bool,
    "sglang_limit_nofile": rule_nofile,
    "sglang_limit_memlock": lambda v: rule_size(v, allow_infinity=True),
    "sglang_device_allow": _list_of(rule_device_allow),
    "sglang_systemd_hardening": rule_bool,
    "sglang_unit_environment": lambda v: check_env_map(v, in_unit=True),
    "sglang_journald_dropin": rule_bool,
    "sglang_journald_max_use": rule_size,
    "sglang_journald_retention": rule_timespan,
    "sglang_remove_stale_units": rule_bool,
    "sglang_host_checks": rule_bool,
    "sglang_reachability_check": rule_bool,
    "sglang_reachability_listen_s": rule_int,
    "sglang_reachability_connect_s": rule_int,
    "sglang_health_timeout_s": rule_int,
    "sglang_health_poll_s": rule_int,
    "sglang_health_progress_s": rule_int,
    "sglang_generate_prompt": rule_text,
    "sglang_generate_max_tokens": lambda v: rule_int(v, 1, unit="tokens"),
    "sglang_server_argv_check": rule_bool,
    "sglang_rolling_instances": _list_of(rule_instance_id),
    # a controller path into the quality gate's argv (a list, no shell); empty turns the gate off
    "sglang_rolling_quality_baseline": lambda v: rule_argv_path(v, required=False),
    "sglang_rolling_reach_timeout_s": rule_int,
    "sglang_rolling_drain_timeout_s": rule_int,
    "sglang_rolling_drain_poll_s": rule_int,
    "sglang_rolling_drain_s": lambda v: rule_int(v, 0),
    "sglang_router_install_root": rule_unit_path,
    "sglang_router_install": rule_bool,
    "sglang_router_bind_host": rule_bind_address,
    "sglang_router_prometheus_host": rule_bind_address,
    "sglang_router_extra_args": _dict_shape,
    "sglang_router_flags": lambda v: rule_name(v, "profile"),
    "sglang_router_user": lambda v: rule_not_root(v, "user"),
    "sglang_router_group": lambda v: rule_not_root(v, "group"),
    "sglang_router_state_dir": lambda v: rule_systemd_dir(v, "/var/lib"),
    "sglang_router_cache_dir": lambda v: rule_systemd_dir(v, "/var/cache"),
    "sglang_router_limit_nofile": rule_nofile,
    "sglang_router_restart_sec": rule_int,
    "sglang_router_ready_timeout_s": rule_int,
    "sglang_router_ready_poll_s": rule_int,
    "sglang_router_smoke": rule_bool,
    "sglang_router_smoke_requests": lambda v: rule_int(v, 1, unit="requests"),
    "sglang_router_smoke_prompt": rule_text,
    "sglang_router_smoke_max_tokens": lambda v: rule_int(v, 1, unit="tokens"),
    "sglang_router_smoke_timeout_s": rule_int,
    "sglang_router_front": rule_bool,
    "sglang_router_front_retries": lambda v: rule_int(v, 1, 120, unit="retries"),
    "sglang_router_front_maxconn": lambda v: rule_int(v, 16, unit="connections"),
    "sglang_router_front_haproxy": rule_unit_path,
    "sglang_router_front_package": lambda v: rule_name(v, "package"),
    "sglang_router_front_install": rule_bool,
    "sglang_router_front_disable_distro_unit": rule_bool,
    "sglang_router_front_ready_timeout_s": rule_int,
}
# Not checked here, and why.
NOT_CHECKED = {
    "sglang_placeholder": "the placeholder marker itself (checked by 'Validate | no placeholder left')",
    "sglang_placeholder_vars": "names of variables, never sent to a host",
    # choices are said where Ansible checks them (issue 39): roles/sglang/meta/argument_specs.yml
    "sglang_model_verify": SPEC_CHOICES,
    "sglang_device_policy": SPEC_CHOICES,
    "sglang_restart_strategy": SPEC_CHOICES,
    "sglang_rolling_drain_on_timeout": SPEC_CHOICES,
}
SECRET_VARS = ("sglang_api_key",)
# Relations between numbers: (smaller, larger, strictly smaller?, why)
ORDER_RULES = (
    ("sglang_health_poll_s", "sglang_health_timeout_s", False,
     "a poll interval longer than the whole wait never polls twice"),
    ("sglang_router_ready_poll_s", "sglang_router_ready_timeout_s", False,
     "a poll interval longer than the wait never polls twice"),
    ("sglang_fabric_wait_timeout_s", "sglang_start_timeout_s", True,
     "TimeoutStartSec= bounds the ExecStartPre= fabric wait: a wait as long as that is killed as a start timeout"),
    ("sglang_reachability_connect_s", "sglang_reachability_listen_s", False,
     "the listener must outlive a connect attempt"),
)


def _fmt(host, var, exc):
    prefix = "%s: " % host if host else ""
    return "%s%s: %s; rule: %s; fix: %s" % (prefix, var, exc.found, exc.rule, exc.fix)


def _run(problems, host, var, check, value):
    try:
        check(value)
    except Refusal as exc:
        problems.append(_fmt(host, var, exc))
        return False
    return True


def check_env_map(env, where=None, problems=None, host=None, in_unit=False):
    """KEY=VALUE pairs for an env file (or the unit's Environment=). Raises the first Refusal when problems is None."""
    collect = problems is not None
    if not isinstance(env, dict):
        exc = Refusal("%s %s" % (_type_name(env), show(env)), "a mapping NAME: value", "write {NAME: value}")
        if collect:
            problems.append(_fmt(host, where, exc))
            return
        raise exc
    for name, value in env.items():
        label = "%s.%s" % (where, name) if where else str(name)
        try:
            rule_name(name, "env_name")
            if value is not None:   # null drops a variable (sglang_server_extra_env)
                rule_env_value(value, secret=bool(SECRET_NAME_RE.search(str(name))), in_unit=in_unit)
        except Refusal as exc:
            if not collect:
                raise Refusal("%s: %s" % (name if isinstance(name, str) else show(name), exc.found), exc.rule,
                              exc.fix) from None
            problems.append(_fmt(host, label, exc))


def check_args_map(args, where, problems, host=None):
    """{--flag: value} of the profile, the overrides or the extra args."""
    if not isinstance(args, dict):
        problems.append(_fmt(host, where, Refusal("%s %s" % (_type_name(args), show(args)), "a mapping --flag: value",
                                                  "write {\"--flag\": value}")))
        return
    for flag, value in args.items():
        label = "%s[%s]" % (where, flag if isinstance(flag, str) and "\n" not in flag else show(flag))
        if _run(problems, host, label, lambda f: rule_name(f, "flag"), flag):
            _run(problems, host, label, rule_arg_value, value)


def check_role_inputs(values, host=None):
    """Every variable of ROLE_RULES present in `values` ({name: value}); plus the number relations."""
    problems, broken = [], set()
    for var, check in ROLE_RULES.items():
        if var in values and not _run(problems, host, var, check, values[var]):
            broken.add(var)
    for small, large, strict, why in ORDER_RULES:   # only between values that passed their own rule
        a, b = to_int(values.get(small)), to_int(values.get(large))
        if a is not None and b is not None and not {small, large} & broken and (a >= b if strict else a > b):
            problems.append(_fmt(host, small, Refusal(
                "%d is not below %s %d" % (a, large, b) if strict else "%d is larger than %s %d" % (a, large, b),
                "%s %s %s: %s" % (small, "<" if strict else "<=", large, why),
                "lower %s or raise %s" % (small, large))))
    for var in ("sglang_server_extra_args", "sglang_router_extra_args"):
        if isinstance(values.get(var), dict):
            check_args_map(values[var], var, problems, host)
    if isinstance(values.get("sglang_server_extra_env"), dict):
        check_env_map(values["sglang_server_extra_env"], "sglang_server_extra_env", problems, host)
    overrides = values.get("sglang_profile_overrides")
    if isinstance(overrides, dict):
        problems.extend(check_profile_data(overrides, "sglang_profile_overrides", host))
    return problems


def check_profile_data(data, where, host=None):
    """The parts of a profile (or of sglang_profile_overrides) that reach a host: args, env, ports."""
    problems = []
    for role_name, role in ((data.get("roles") or {}) if isinstance(data.get("roles"), dict) else {}).items():
        rwhere = "%s.roles.%s" % (where, role_name)
        if not isinstance(role, dict):
            problems.append(_fmt(host, rwhere, Refusal(_type_name(role), "a mapping", "write a mapping")))
            continue
        if "args" in role:
            check_args_map(role["args"] or {}, rwhere + ".args", problems, host)
        if "env" in role:
            check_env_map(role["env"] or {}, rwhere + ".env", problems, host)
        for key in ("port_base", "nccl_port_base", "bootstrap_port_base"):
            if role.get(key) is not None:
                _run(problems, host, "%s.%s" % (rwhere, key), rule_port, role[key])
        if "instances_per_host" in role:
            _run(problems, host, rwhere + ".instances_per_host", lambda v: rule_int(v, 1, 8, unit="instances"),
                 role["instances_per_host"])
    router = data.get("router")
    if isinstance(router, dict):
        for key in ("port", "prometheus_port"):
            if key in router:
                _run(problems, host, "%s.router.%s" % (where, key), rule_port, router[key])
        if "args" in router:
            check_args_map(router["args"] or {}, where + ".router.args", problems, host)
    return problems


def check_host_inputs(host, hvars):
    """Per-host variables: sglang_advertise_address (when set) and sglang_instance_overrides."""
    problems = []
    if hvars.get("sglang_advertise_address") not in (None, ""):
        _run(problems, host, "sglang_advertise_address", rule_advertise_address, hvars["sglang_advertise_address"])
    overrides = hvars.get("sglang_instance_overrides") or {}
    if not isinstance(overrides, dict):
        problems.append(_fmt(host, "sglang_instance_overrides", Refusal(_type_name(overrides), "a mapping per "
                             "instance name (W0, P0, ...)", "write {W0: {...}}")))
        return problems
    for iname, ov in overrides.items():
        where = "sglang_instance_overrides.%s" % iname
        if not _run(problems, host, where, lambda n: rule_name(n, "instance"), iname):
            continue
        if not isinstance(ov, dict):
            problems.append(_fmt(host, where, Refusal(_type_name(ov), "a mapping", "write {port: N, ...}")))
            continue
        for key in ov:
            if key not in INSTANCE_OVERRIDE_KEYS:
                problems.append(_fmt(host, "%s.%s" % (where, key), Refusal(
                    "unknown key %s" % show(key), "one of %s" % ", ".join(INSTANCE_OVERRIDE_KEYS),
                    "fix the spelling")))
        for key in ("port", "nccl_port", "bootstrap_port"):
            if key in ov and ov[key] is not None:
                _run(problems, host, "%s.%s" % (where, key), rule_port, ov[key])
        if "gpus" in ov:
            _run(problems, host, where + ".gpus", _list_of(lambda g: rule_int(g, 0, 63, unit="(GPU index)")),
                 ov["gpus"])
            if isinstance(ov["gpus"], list) and any(isinstance(g, str) for g in ov["gpus"]):
                problems.append(_fmt(host, where + ".gpus", Refusal(
                    "%s holds strings" % show(ov["gpus"]), "a list of GPU indices as numbers",
                    "write them without quotes, e.g. [0, 1, 2, 3]")))
        if "ib_devices" in ov:
            _run(problems, host, where + ".ib_devices", _list_of(lambda d: rule_name(d, "ib_device")),
                 ov["ib_devices"])
        if "args" in ov:
            check_args_map(ov["args"] or {}, where + ".args", problems, host)
        if "env" in ov:
            check_env_map(ov["env"] or {}, where + ".env", problems, host)
    return problems


def check_secret(name, value, host=None, optional=True, min_len=SECRET_MIN_LEN, max_len=SECRET_MAX_LEN):
    """One secret: [] or one message without the value. The key a running router holds (read back from its env file)
    is checked with min_len=1: it only has to be sendable as a Bearer token, whatever length it was set with."""
    problems = []
    _run(problems, host, name, lambda v: rule_secret(v, optional=optional, min_len=min_len, max_len=max_len), value)
    return problems


# --- roles/model_weights (issue 28) -----------------------------------------------------------------------------------
def rule_weights_source(value):
    """model_weights_source: the values that reach a host (paths as quoted argv, the URL as curl's --url, the S3
    endpoint as rclone's env), no credentials in the URL (those come from the vault vars). Its shape (a mapping, the
    type, the keys each type needs, no other key) is the argument spec of b300.rollout.model_weights_plan
    (SOURCE_SPEC), which refuses first; what no spec can say is here."""
    rule = ("a mapping {type: none} | {type: path, path: /ABS, where: host|controller} | {type: http, url: https://..., "
            "ca_file: /ABS} | {type: s3, endpoint: https://..., bucket: NAME, prefix: P, region: R}, without "
            "credentials (model_weights_s3_* / model_weights_http_* from the vault)")
    for key in ("path", "ca_file"):
        if value.get(key):
            rule_argv_path(value[key])
    for key in ("url", "endpoint"):
        v = value.get(key)
        if v in (None, ""):
            continue
        m = re.match(r"^https?://([^/?#]+)(/[^?#]*)?$", v) if isinstance(v, str) else None
        if not m:
            raise Refusal("%s: %s is not an http(s) URL without query or fragment" % (key, show(v)), rule,
                          "write http(s)://HOST[:PORT]/PATH")
        if "@" in m.group(1):
            raise Refusal("%s carries credentials (user:password@, value not shown)" % key, rule,
                          "put them in the vault variables: a URL is printed and reaches curl's argv")
        bad = _bad_char(v)
        if bad or " " in v:
            raise Refusal("%s: %s holds %s" % (key, show(v), _describe(bad[1] if bad else " ")), rule,
                          "percent-encode it")
    for key in ("bucket", "prefix", "region", "provider"):
        v = value.get(key)
        if v not in (None, "") and (not isinstance(v, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", v)):
            raise Refusal("%s: %s" % (key, show(v)), rule, "letters, digits and . _ - / only")


def _digests(value):
    _dict_shape(value)
    for rel, digest in value.items():
        if not isinstance(digest, str) or not SHA256_RE.match(digest):
            raise Refusal("the digest of %s is %s" % (show(rel), show(digest)), "64 lower-case hex digits (the "
                          "manifest digest tools/weights-manifest prints)", "copy the digest it printed")


def _mode(value):
    if not (isinstance(value, str) and re.match(r"^0[0-7]{3}$", value)):
        raise Refusal("%s" % show(value), "an octal mode as a quoted string, e.g. \"0640\"", "quote it: \"0640\"")


# variable -> check(value); every variable of roles/model_weights/defaults/main.yml is here or in
# MODEL_WEIGHTS_NOT_CHECKED (tests/unit/test_model_weights.py keeps them in sync).
MODEL_WEIGHTS_RULES = {
    "model_weights_source": rule_weights_source,
    "model_weights_manifest_dir": rule_argv_path,
    "model_weights_digests": _digests,
    "model_weights_fanout": rule_bool,
    "model_weights_parallel_files": lambda v: rule_int(v, 1, 64, unit="files"),
    "model_weights_reserve_gib": lambda v: rule_int(v, 0, unit="GiB"),
    "model_weights_retries": lambda v: rule_int(v, 0, 20, unit="retries"),
    "model_weights_retry_delay_s": lambda v: rule_int(v, 0, 600),
    "model_weights_retry_max_delay_s": lambda v: rule_int(v, 0, 3600),
    "model_weights_lock_wait_s": lambda v: rule_int(v, 0),
    "model_weights_takeover": rule_bool,
    "model_weights_progress_s": rule_int,
    "model_weights_timeout_s": rule_int,
    "model_weights_stall_s": rule_int,
    "model_weights_peer_wait_s": rule_int,
    "model_weights_drop_cache": rule_bool,
    "model_weights_serve_port": rule_port,
    "model_weights_serve_address": rule_advertise_address,
    "model_weights_controller_address": lambda v: None if v in ("", None) else rule_advertise_address(v),
    "model_weights_owner": lambda v: rule_name(v, "posix_name"),
    "model_weights_group": lambda v: rule_name(v, "posix_name"),
    "model_weights_file_mode": _mode,
    "model_weights_dir_mode": _mode,
    "model_weights_protect_home": rule_bool,
    "model_weights_run_dir": rule_unit_path,
    "model_weights_http_user": lambda v: rule_text(v, required=False),
}
MODEL_WEIGHTS_NOT_CHECKED = {
    "model_weights_writeback": SPEC_CHOICES,
    "model_weights_verify": SPEC_CHOICES,
    "model_weights_s3_access_key_id": "a secret: checked by check_model_weights_secrets, never shown",
    "model_weights_s3_secret_access_key": "a secret: checked by check_model_weights_secrets, never shown",
    "model_weights_http_token": "a secret: checked by check_model_weights_secrets, never shown",
    "model_weights_http_password": "a secret: checked by check_model_weights_secrets, never shown",
}
MODEL_WEIGHTS_SECRETS = tuple(sorted(k for k, why in MODEL_WEIGHTS_NOT_CHECKED.items() if why.startswith("a secret")))


def check_model_weights_inputs(values, host=None):
    """Every variable of MODEL_WEIGHTS_RULES present in `values`; one line per broken rule (no secret shown)."""
    problems = []
    for var, check in MODEL_WEIGHTS_RULES.items():
        if var in values:
            _run(problems, host, var, check, values[var])
    return problems


def check_model_weights_secrets(secrets, host=None):
    """The credentials: strings without whitespace or control characters (they go into a 0600 file, curl's -K
    config and rclone's environment); the value is never part of a message."""
    problems = []
    for name, value in (secrets or {}).items():
        if value in (None, ""):
            continue
        where = "(secret, value not shown: %d characters)" % len(value) if isinstance(value, str) else "(not a string)"
        bad = None if not isinstance(value, str) else next(
            ((i, char_class(c)) for i, c in enumerate(value) if char_class(c) and c != " " or c in "\"\\"), None)
        if not isinstance(value, str) or bad:
            problems.append(_fmt(host, name, Refusal(
                "%s%s" % (where, " holds %s at character %d" % (bad[1] or "a quote or backslash", bad[0] + 1)
                          if bad else ""),
                "printable text without control characters, quotes or backslashes", "keep it in ansible-vault, "
                "trimmed (a value read from a file keeps its trailing newline: `| trim`)")))
    return problems
