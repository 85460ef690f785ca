"""Templates from code: a :class:`Template` definition (typed steps) built into a named template by
``Manager.build_template`` with pyinfra over the runtime's SSH (see ``docs/templates.md``).

Importing this package does not import pyinfra (the ``templates`` extra): only a build does.
"""

from ..template_registry import BuiltTemplate, TemplateRegistry
from .build import BuildResult, build_template, list_templates, remove_template
from .definition import Template

__all__ = [
    "BuildResult",
    "BuiltTemplate",
    "Template",
    "TemplateRegistry",
    "build_template",
    "list_templates",
    "remove_template",
]
