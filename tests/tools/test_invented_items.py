"""The demo drafter's invented prompts name things that do not exist: never an item of the corpus, and
never a held-out one, whose prompts measure the drafter."""

from tools.demo.corpus import Item, invented_items


def items_of(modules: list[str], functions: int = 20) -> list[Item]:
    return [Item("doc", f"{module}.f{f}", "an answer") for module in modules for f in range(functions)]


def test_every_combination_is_taken_so_none_can_be_invented():
    assert invented_items(items_of([f"m{m}" for m in range(10)]), 50, seed=0) == []


def test_invented_names_are_new_and_built_from_training_items_only():
    """Modules m0 … m9 lack their functions f15 … f19 unless held out; module yy has every function that
    is not held out, module zz only held-out ones."""
    every = items_of([f"m{m}" for m in range(10)])
    missing = {item.name for item in every if item.name.endswith(tuple(f".f{f}" for f in range(15, 20)))
               and not item.held_out}
    items = ([item for item in every if item.name not in missing]
             + [item for item in items_of(["yy"]) if not item.held_out]
             + [item for item in items_of(["zz"]) if item.held_out])
    assert any(item.held_out and item.name.startswith("m") for item in items)
    assert any(item.name.startswith("zz.") for item in items)
    new_in_yy = {item.name for item in items_of(["yy"]) if item.held_out}
    invented = invented_items(items, len(missing) + 10, seed=0)
    assert invented and {item.name for item in invented} <= missing | new_in_yy
    assert all(item.answer == "" for item in invented)
