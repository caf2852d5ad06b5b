"""Import-linter contracts the built-in ones lack: no two of our modules on an import cycle,
and a package that may import only the modules it names.

import-linter's own `acyclic_siblings` counts a subpackage as one node, while the layering
rule has always been about modules.
The graph is the one grimp builds for every contract: every import, those inside functions too.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class AcyclicModulesContract(Contract):
    """Kept when no module imports, directly or through others, a module that imports it."""

    type_name = "acyclic_modules"

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        cycles: set[tuple[str, ...]] = set()
        for importer in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                back = graph.find_shortest_chain(importer=imported, imported=importer)
                if back is not None:
                    cycles.add(_rotated((importer, *back[:-1])))
        output.verbose_print(verbose, f"{len(cycles)} import cycles between modules.")
        return ContractCheck(kept=not cycles, warnings=[], metadata={"cycles": sorted(cycles)})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(" -> ".join([*cycle, cycle[0]]))
            output.new_line()


def _rotated(cycle: tuple[str, ...]) -> tuple[str, ...]:
    """The cycle starting at its smallest name, so each is reported once."""
    start = cycle.index(min(cycle))
    return cycle[start:] + cycle[:start]


class AllowedImportsContract(Contract):
    """Kept when the modules of `source_modules` (and their descendants) import, of our
    packages, only `allowed_modules` and their descendants: a room that names what it may
    touch, rather than what it may not. Direct imports: what a module reaches through another
    is the other's business."""

    type_name = "allowed_imports"
    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        allowed = [module.name for module in self.allowed_modules]  # type: ignore[attr-defined]
        outside: set[tuple[str, str]] = set()
        for source in self.source_modules:  # type: ignore[attr-defined]
            for importer in {source.name} | graph.find_descendants(source.name):
                for imported in graph.find_modules_directly_imported_by(importer):
                    if not any(imported == a or imported.startswith(f"{a}.") for a in allowed):
                        outside.add((importer, imported))
        output.verbose_print(verbose, f"{len(outside)} imports outside the allowed modules.")
        return ContractCheck(kept=not outside, warnings=[], metadata={"outside": sorted(outside)})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported in check.metadata["outside"]:
            output.print_error(f"{importer} -> {imported} (not allowed)")
            output.new_line()
