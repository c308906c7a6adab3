"""Action plugin: render a role's configuration files on the controller, write them with one module run.

`template` entries are rendered like ansible.builtin.template renders them (the role's templates/
folder, the task's variables, `ansible_managed`); `src` entries are read from the role's files/
folder as they are. The module (plugins/modules/config_files.py, where the documentation lives)
then compares and writes every file on the node in a single run.
"""

from __future__ import annotations

import os

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase

try:  # ansible-core 2.19 templates only what is marked as a trusted template
    from ansible.template import trust_as_template
except ImportError:  # pragma: no cover - ansible-core < 2.19 trusts template text as it is

    def trust_as_template(text):
        return text


SOURCES = ("content", "template", "src")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files", "directories"))

    def _render(self, name: str, dest: str, task_vars: dict) -> str:
        source = self._find_needle("templates", name)
        text = trust_as_template(self._loader.get_text_file_contents(source))
        searchpath = [os.path.dirname(source)] + list(task_vars.get("ansible_search_path", []))
        temp_vars = dict(task_vars)
        # What ansible.builtin.template offers a template, for the `# {{ ansible_managed }}` headers.
        temp_vars.setdefault("ansible_managed", C.config.get_config_value("DEFAULT_MANAGED_STR"))
        temp_vars.update(template_path=name, template_fullpath=source, template_destpath=dest)
        templar = self._templar.copy_with_new_env(searchpath=searchpath, available_variables=temp_vars)
        rendered = templar.template(text, escape_backslashes=False)
        return "" if rendered is None else str(rendered)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        files = self._task.args.get("files") or []
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise AnsibleActionFail("files must be a list of mappings (dest, mode and one of content/template/src)")
        prepared = []
        for i, entry in enumerate(files):
            given = [k for k in SOURCES if entry.get(k) is not None]
            dest = entry.get("dest")
            if len(given) != 1:
                raise AnsibleActionFail(
                    f"files[{i}] ({dest}): give exactly one of content, template or src (got {given or 'none'})"
                )
            out = {k: v for k, v in entry.items() if k not in SOURCES}
            try:
                if given[0] == "template":
                    out["content"] = self._render(entry["template"], dest, task_vars)
                elif given[0] == "src":
                    path = self._find_needle("files", entry["src"])
                    with open(path, encoding="utf-8") as f:
                        out["content"] = f.read()
                else:
                    out["content"] = entry["content"]
            except AnsibleError as e:
                raise AnsibleActionFail(f"files[{i}] ({dest}): {e}") from e
            prepared.append(out)
        module_args = {"files": prepared, "directories": self._task.args.get("directories") or []}
        result.update(
            self._execute_module(
                module_name="sparkops.cluster.config_files", module_args=module_args, task_vars=task_vars
            )
        )
        return result
