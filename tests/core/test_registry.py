"""rllib_spear.registry.Registry: the name -> object registry behind the recipe layer."""
import sys

import pytest

from rllib_spear.registry import Registry


def test_register_direct_and_get():
    r = Registry("widget")
    obj = object()
    assert r.register("a", obj) is obj
    assert r.get("a") is obj
    assert "a" in r and "b" not in r
    assert r.names() == ["a"] and list(r) == ["a"] and len(r) == 1


def test_register_as_decorator_returns_object_unchanged():
    r = Registry("widget")

    @r.register("w")
    class W:
        pass

    assert r.get("w") is W
    assert W.__name__ == "W"

    @r.register("f")
    def f():
        return 3

    assert r.get("f")() == 3


def test_names_sorted_and_items():
    r = Registry("widget")
    for n in ("c", "a", "b"):
        r.register(n, n.upper())
    assert r.names() == ["a", "b", "c"]
    assert r.items() == [("a", "A"), ("b", "B"), ("c", "C")]


def test_unknown_name_lists_choices_and_register_function():
    r = Registry("widget", register_hint="pkg.register_widget")
    r.register("x", 1)
    r.register("y", 2)
    with pytest.raises(ValueError) as e:
        r.get("zz")
    msg = str(e.value)
    assert "unknown widget 'zz'" in msg
    assert "['x', 'y']" in msg
    assert "pkg.register_widget('zz')" in msg


def test_default_register_hint():
    with pytest.raises(ValueError, match=r"register_reward_fn\('q'\)"):
        Registry("reward fn").get("q")


def test_unhashable_name_is_an_unknown_name():
    r = Registry("widget")
    with pytest.raises(ValueError, match="unknown widget"):
        r.get(["not", "hashable"])
    assert ["x"] not in r


def test_duplicate_raises_unless_override():
    r = Registry("widget")
    r.register("a", 1)
    with pytest.raises(ValueError, match="already registered.*override=True"):
        r.register("a", 2)
    assert r.get("a") == 1
    with pytest.raises(ValueError):
        r.register("a")(lambda: None)
    r.register("a", 2, override=True)
    assert r.get("a") == 2

    @r.register("a", override=True)
    class A:
        pass

    assert r.get("a") is A


def test_same_object_again_is_a_noop():
    r = Registry("widget")

    class A:
        pass

    r.register("a", A)
    r.register("a", A)
    assert r.get("a") is A and len(r) == 1


@pytest.mark.parametrize("bad", ["", None, 3])
def test_name_must_be_non_empty_string(bad):
    with pytest.raises(TypeError):
        Registry("widget").register(bad, 1)


def test_unregister():
    r = Registry("widget")
    r.register("a", 1)
    assert r.unregister("a") == 1
    assert "a" not in r
    with pytest.raises(KeyError):
        r.unregister("a")


def test_view_is_read_only_and_live():
    r = Registry("widget")
    v = r.view()
    r.register("b", 2)
    r.register("a", 1)
    assert list(v) == ["b", "a"] and v["a"] == 1  # registration order
    with pytest.raises(TypeError):
        v["c"] = 3  # type: ignore[index]


def test_registries_are_independent():
    a, b = Registry("a"), Registry("b")
    a.register("x", 1)
    assert "x" not in b


def test_repr():
    r = Registry("widget")
    r.register("a", 1)
    assert repr(r) == "Registry('widget', names=['a'])"


def test_module_imports_without_ray():
    # The package __init__ registers algorithms with Tune (imports Ray) unless told not to; the
    # registry module itself must not pull Ray in.
    import os
    import subprocess

    code = "import sys, rllib_spear.registry; sys.exit(int('ray' in sys.modules))"
    env = dict(os.environ, RLLIB_SPEAR_NO_REGISTER="1")
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
