# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Ordinary values, and values a shell would run, split or expand, that a launcher must pass on byte for byte.

``{marker}`` stands for a file that exists only if a value was run as a command.
"""

VALUES = {
    "plain": "plain",
    "space": "two words",
    "apostrophe": "it's",
    "quotes": '"double" and \'single\' quotes',
    "dollar-paren": "$(touch {marker})",
    "backticks": "`touch {marker}`",
    "semicolon": "a;touch${{IFS}}{marker}",
    "and-or": "a && touch {marker} || b",
    "redirect": "> {marker}",
    "variables": "$HOME ${{PATH}} \\$escaped",
    "glob": "*",
    "tilde": "~",
    "bang": "!bang",
    "percent": "100%n %h %u %% %",
    "backslash": "back\\slash",
    "json": '{{"lr": [1e-3, 2], "name": "a b"}}',
    "unicode": "unicode: h\u00e9llo w\u00f6rld \u2713",
    "equals": "a=b=c",
    "tab": "tab\there",
    "empty": "",
    "newline": "line one\nline two",
}
# Not .deepspeed_env lines: a line cannot hold a line break; there $NAME takes the node's value, and $(...) and
# backticks are refused by line (tests/unit/launcher/test_remote_command_quoting.py tests both).
NOT_IN_ENV_FILE = {"newline", "dollar-paren", "backticks", "semicolon", "variables"}


def filled(name, marker):
    return VALUES[name].format(marker=marker)
