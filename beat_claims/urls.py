"""How a store's URL is shown: every password masked, in every log line, message and page.

:func:`redact_url` is the one way a URL (or a libpq ``key=value`` string) is shown. It
replaces with ``***``:

- the password of the user-info (``user:pw@``, ``:pw@``), and a lone ``pw@`` except for
  PostgreSQL (libpq reads it as the user; redis-cli and the Redis URI scheme read it as
  the password, redis-py as an ACL user with an empty password: a user who wrote it may
  well have meant a password);
- the value of every query parameter whose name (``%``-decoded, any case) says password,
  secret or token (``password=``, ``sentinel_password=``, ``sslpassword=``...), and of
  every ``key=value`` pair of a libpq string whose key does;

in each URL of a ``;``-joined list (``sentinel://a;sentinel://b/0``).

A URL that does not parse as written is masked more, never less: it is read every way it
may be meant (the user-info ending at any of its ``@``: a password may hold an unescaped
``/ ? # @ ;``, a query value an ``@``) and what any reading calls secret is masked; a
"port" that is not a number (``redis://u:pa/ss`` without its ``@``) is masked to the end
of that URL, and text that a secret value runs into (``password=a?b``: ``b`` too) with
it. It never raises: on a bug it shows ``***`` alone.

Clients echo parts of a URL they misread in their errors (a host ``sec`` from
``redis://sec/ret@host``, libpq's ``invalid percent-encoded token: "..."``):
:func:`redact_text` masks what :func:`redact_url` would mask, and its pieces, in such a
message; :func:`raise_redacted` raises a store's error with its message so masked.
"""

from __future__ import annotations

import re
from itertools import groupby
from typing import NoReturn
from urllib.parse import unquote, unquote_plus

MASK = "***"
#: A query parameter or libpq key whose value is a secret (its name, any case, contains one).
SECRET_NAME = re.compile(r"pass(?:word|wd)|pwd|secret|token", re.IGNORECASE)
#: Schemes whose lone user-info (``scheme://name@host``) is a user, never a password.
USER_SCHEMES = ("postgresql", "postgres")

_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\-]*")
#: Where the next URL of a list starts: ``;`` before ``scheme://``.
_NEXT_URL = re.compile(r";(?=\s*[A-Za-z][A-Za-z0-9+.\-]*://)")
#: A libpq ``key=value`` string starts with a key and ``=``; a URL never does.
_DSN = re.compile(r"\s*[A-Za-z_][\w.\-]*\s*=")
_DSN_KEY = re.compile(r"([A-Za-z_][\w.\-]*)(\s*=\s*)")
#: A query parameter's name, as clients read one (anything else continues the value before).
_PARAM_NAME = re.compile(r"[\w.\-%+\[\]]+")
#: Where a piece of a secret may end in a client's error message.
_DELIMITERS = re.compile(r"[/?#@;:&=,\s'\"\\]+")
#: The most ways one URL is read (one per ``@`` after its authority); a URL with more
#: ``@`` is masked whole, but its scheme.
MAX_READINGS = 16
#: Pieces of a secret shorter than this are not looked for in messages (they would mask
#: unrelated words); a whole secret is, whatever its length.
_MIN_PIECE = 3

Piece = tuple[str, bool]  # (text, secret)


def redact_url(url: str) -> str:
    """``url`` as it may be shown: every password (and secret) replaced by ``***``."""
    try:
        return "".join(MASK if secret else text for text, secret in _merged(str(url)))
    except Exception:  # a bug here must never show a password, nor stop a caller
        return MASK


def redact_text(text: str, url: str) -> str:
    """``text`` (a client's error message about ``url``) without ``url``'s secrets: the
    URL itself is shown as :func:`redact_url` shows it, and each secret, %-decoded or not,
    as written or in lower case, and each piece of it between delimiters (``/ ? # @ :
    ;``...) of at least three characters, is masked where it stands as a word."""
    try:
        text = str(text)
        url = str(url)
        if url:
            text = text.replace(url, redact_url(url))
        words = _secret_words(url)
        if not words:
            return text
        pattern = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        return re.sub(f"(?<![A-Za-z0-9])(?:{pattern})(?![A-Za-z0-9])", MASK, text)
    except Exception:
        return MASK


def raise_redacted(error: BaseException, url: str, cause: BaseException) -> NoReturn:
    """Raise ``error`` (a store's error made from the client's ``cause``) with
    :func:`redact_text`'s message, chained to ``cause`` (shown in tracebacks) only when
    the cause's own message holds none of ``url``'s secrets."""
    message = str(error)
    masked = redact_text(message, url)
    if masked != message:
        error.args = (masked,)
    text = str(cause)
    raise error from (cause if redact_text(text, url) == text else None)


def hide_from_celerys_reports() -> None:
    """Celery prints an app's settings (``celery report``; ``celery inspect conf`` sends a
    worker's to whoever asks over the broker, and Flower shows them) with those whose name
    says a secret masked (its ``HIDDEN_SETTINGS``, which names ``beat_dburi`` for the
    same reason), and the broker's and backends' URLs redacted: never
    ``beat_claims_url``, which it would print as written. Its name is added there, once
    per process (when beat-claims is imported)."""
    try:
        from celery.app import utils
    except ImportError:  # (not a Celery that has it: nothing to add to)
        return
    hidden = getattr(utils, "HIDDEN_SETTINGS", None)
    if isinstance(hidden, re.Pattern) and not hidden.search("beat_claims_url"):
        utils.HIDDEN_SETTINGS = re.compile(f"(?:{hidden.pattern})|BEAT_CLAIMS_URL",
                                           hidden.flags | re.IGNORECASE)


# -- reading -------------------------------------------------------------------------------
def _merged(text: str) -> list[Piece]:
    """``text`` cut into pieces that, joined, give it back, each secret or not."""
    out: list[Piece] = []
    i = 0
    for secret, run in groupby(_mask(text)):
        n = len(list(run))
        out.append((text[i:i + n], secret))
        i += n
    return out


def _secret_words(url: str) -> set[str]:
    words: set[str] = set()
    for piece, secret in _merged(url):
        if not secret:
            continue
        for form in {piece, unquote(piece), unquote_plus(piece)}:
            for variant in (form, form.lower()):  # (a client lower-cases a host it misread)
                words.add(variant)
                words.update(w for w in _DELIMITERS.split(variant) if len(w) >= _MIN_PIECE)
    words.discard("")
    return words


def _mask(text: str) -> list[bool]:
    """For each character of ``text``: is it part of a secret?"""
    if _DSN.match(text):
        return _flags(text, _dsn(text))
    if "://" not in text:
        return _flags(text, _opaque(text))
    mask: list[bool] = []
    start = 0
    for sep in _NEXT_URL.finditer(text):
        mask += [*_url_mask(text[start:sep.start()]), False]
        start = sep.end()
    return mask + _url_mask(text[start:])


def _url_mask(part: str) -> list[bool]:
    """A character is secret when any reading of the URL makes it so."""
    readings = [_flags(part, reading) for reading in _url(part)]
    return [any(flags) for flags in zip(*readings)]


def _flags(text: str, pieces: list[Piece]) -> list[bool]:
    flags = [secret for piece, secret in pieces for _ in piece]
    if len(flags) != len(text):  # (a bug: the pieces do not give the text back)
        raise ValueError("pieces do not cover the text")
    return flags


def _url(part: str) -> list[list[Piece]]:
    """One URL, ``scheme://[userinfo@]hosts[/path][?query][#fragment]``, read every way
    it may be meant: the user-info ends at any of its ``@`` (a parser reads the authority's
    last one, but a password may hold ``/ ? #``, and a query value an ``@``), or none."""
    scheme, sep, rest = part.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return [_opaque(part)]
    ats = {-1}
    if not rest.startswith("/"):  # (no authority: unix:///path, sqlite:///path: @ is a path's)
        end = _authority_end(rest)
        ats = {rest[:end].rfind("@")} | {i for i in range(end, len(rest)) if rest[i] == "@"}
        if len(ats) > MAX_READINGS:  # (bounded work: all of it masked)
            return [[(scheme + sep, False), (rest, True)]]
    return [[(scheme + sep, False), *_authority(scheme, rest, at)] for at in sorted(ats)]


def _authority_end(rest: str) -> int:
    end = re.search(r"[/?#]", rest)
    return end.start() if end else len(rest)


def _authority(scheme: str, rest: str, at: int) -> list[Piece]:
    out: list[Piece] = []
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
        user, colon, password = userinfo.partition(":")
        if colon:
            out += [(user + colon, False), (password, True)]
        else:
            out.append((user, scheme.strip().lower() not in USER_SCHEMES))
        out.append(("@", False))
    end = _authority_end(rest)
    hosts, tail = rest[:end], rest[end:]
    odd = _odd_host(hosts)
    if odd >= 0:  # not hosts and ports: a password with a / ? or #, or without its @
        later = tail.rfind("@")
        if later < 0:
            return [*out, (hosts[:odd], False), (hosts[odd:] + tail, True)]
        return [*out, (hosts[:odd], False), (hosts[odd:] + tail[:later], True), ("@", False),
                *_authority(scheme, tail[later + 1:], -1)]
    return [*out, (hosts, False), *_params(tail)]


def _odd_host(hosts: str) -> int:
    """Where the hosts (``h1:6379,[::1]:26379``) stop looking like hosts and ports, or -1."""
    offset = 0
    for host in hosts.split(","):
        port_at = 0
        if host.startswith("["):
            close = host.find("]")
            if close < 0:
                return offset
            port_at = close + 1
        if re.search(r"[\s=&;@?]", host):
            return offset
        colon = host.find(":", port_at)
        if colon >= 0 and not host[colon + 1:].isdigit() and host[colon + 1:]:
            return offset + colon + 1
        if port_at and host[port_at:] and colon != port_at:
            return offset + port_at
        offset += len(host) + 1
    return -1


def _opaque(text: str) -> list[Piece]:
    """Not a URL (``django:ALIAS``, ``redis:/h``, a typo): all before the last ``@`` is
    masked but a leading ``scheme:``, and secret parameters anywhere."""
    at = text.rfind("@")
    if at < 0:
        return _params(text)
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", text)
    keep = scheme.end() if scheme and scheme.end() <= at else 0
    return [(text[:keep], False), (text[keep:at], True), ("@", False), *_params(text[at + 1:])]


def _params(tail: str) -> list[Piece]:
    """A path, query and fragment: the values of secret parameters masked, with any text
    that continues them (up to the next ``name=``)."""
    out: list[Piece] = []
    secret = False
    for token in re.split(r"([?&;])", tail):
        if token in ("?", "&", ";") or not token:
            out.append((token, False))
            continue
        name, eq, value = token.partition("=")
        if eq and _PARAM_NAME.fullmatch(name):
            secret = _secret_name(name)
            out += [(name + eq, False), (value, secret)]
        else:
            out.append((token, secret))
    return out


def _secret_name(name: str) -> bool:
    for _ in range(4):  # %-escaped names (pass%77ord), even twice over
        if SECRET_NAME.search(name):
            return True
        decoded = unquote_plus(name)
        if decoded == name:
            return False
        name = decoded
    return True  # escaped that deep: masked rather than read further


def _dsn(text: str) -> list[Piece]:
    """A libpq ``key=value`` string; values may be quoted (``'a b\\'c'``). A word that is
    not ``key=value`` continues the value before it."""
    out: list[Piece] = []
    secret = False
    i, n = 0, len(text)
    while i < n:
        space = re.match(r"\s+", text[i:])
        if space:
            out.append((space.group(), False))
            i += space.end()
            continue
        key = _DSN_KEY.match(text, i)
        if key:
            secret = bool(SECRET_NAME.search(key.group(1)))
            out.append((key.group(), False))
            i = key.end()
        end = _dsn_value_end(text, i)
        out.append((text[i:end], secret))
        i = end
    return out


def _dsn_value_end(text: str, i: int) -> int:
    n = len(text)
    if i < n and text[i] == "'":
        i += 1
        while i < n and text[i] != "'":
            i += 2 if text[i] == "\\" else 1
        return min(n, i + 1)  # (unterminated: the rest of the string)
    while i < n and not text[i].isspace():
        i += 2 if text[i] == "\\" else 1
    return min(n, i)


__all__ = ["MASK", "SECRET_NAME", "hide_from_celerys_reports", "raise_redacted", "redact_text",
           "redact_url"]
