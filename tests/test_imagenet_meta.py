"""ImageNet metadata: WordNet ids, class names, template sets, the shifts' 200-class subsets, ObjectNet's map."""
import json

import pytest

from hardrank.errors import DataError, UsageError
from hardrank.suites.imagenet import (
    IMAGENET_WNIDS,
    OBJECTNET_MAPPING_FILES,
    builtin_templates,
    folder_class_index,
    imagenet_classnames,
    objectnet_classes,
    shift_subset,
)


def test_wnids_are_the_1000_classes_in_standard_order():
    assert len(IMAGENET_WNIDS) == 1000 and len(set(IMAGENET_WNIDS)) == 1000
    assert list(IMAGENET_WNIDS) == sorted(IMAGENET_WNIDS)  # the standard order is the sorted WordNet ids
    assert IMAGENET_WNIDS[0] == "n01440764" and IMAGENET_WNIDS[1] == "n01443537"
    assert IMAGENET_WNIDS[207] == "n02099601"  # golden retriever
    assert IMAGENET_WNIDS[999] == "n15075141"


def test_classnames_follow_the_wnid_order():
    names = imagenet_classnames()
    assert len(names) == 1000
    assert (names[0], names[1], names[207], names[999]) == ("tench", "goldfish", "Golden Retriever", "toilet paper")
    names.append("x")  # a fresh list each call: callers may edit theirs
    assert len(imagenet_classnames()) == 1000


def test_openai_and_simple_templates_are_format_strings():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES
    openai, simple = builtin_templates("openai"), builtin_templates("simple")
    assert (len(openai), len(simple)) == (80, 7)
    assert openai[0] == "a bad photo of a {c}." and simple[0] == "itap of a {c}."
    for templates, lambdas in ((openai, OPENAI_IMAGENET_TEMPLATES), (simple, SIMPLE_IMAGENET_TEMPLATES)):
        assert all(t.count("{c}") == 1 for t in templates)
        # format() gives exactly open_clip's prompt, also for a name with braces or quotes in it
        for name in ("tench", "jack-o'-lantern", "a {b}"):
            assert [t.format(c=name) for t in templates] == [f(name) for f in lambdas]


def test_unknown_template_set_lists_the_names():
    with pytest.raises(UsageError, match=r"'cupl'.*\['openai', 'simple'\]"):
        builtin_templates("cupl")


def test_imagenet_r_and_a_are_200_published_classes():
    r, a = shift_subset("imagenet-r"), shift_subset("imagenet-a")
    for sub in (r, a):
        assert len(sub) == 200 and len(set(sub)) == 200 and sub == sorted(sub) and 0 <= sub[0] and sub[-1] < 1000
    # first and last of Hendrycks et al.'s lists, and members named in their eval.py
    assert r[:5] == [1, 2, 4, 6, 8] and r[-3:] == [981, 983, 988]
    assert a[:5] == [6, 11, 13, 15, 17] and a[-3:] == [986, 987, 988]
    assert 207 in r and 207 in a  # golden retriever is in both
    assert 0 not in r and 1 not in a  # tench in neither; goldfish only in -R
    assert IMAGENET_WNIDS[r[0]] == "n01443537" and IMAGENET_WNIDS[a[0]] == "n01498041"
    assert shift_subset("imagenet-r") is not r  # fresh lists


@pytest.mark.parametrize("name", ["imagenet-1k", "imagenet-v2", "imagenet-sketch"])
def test_full_shifts_use_all_classes(name):
    assert shift_subset(name) is None


def test_unknown_shift_lists_the_names():
    with pytest.raises(UsageError, match=r"'imagenet-c'.*imagenet-r"):
        shift_subset("imagenet-c")


def test_folder_class_index():
    assert folder_class_index("n01440764") == 0
    assert folder_class_index("/data/imagenet-r/n01443537") == 1  # a path: its last part
    assert folder_class_index("n15075141") == 999
    assert folder_class_index("0") == 0 and folder_class_index("999") == 999  # ImageNet-V2's folders
    for bad in ("1000", "007", "-1", "n00000000", "tench", ""):
        with pytest.raises(DataError, match=r"WordNet id .* ImageNet-V2 class number"):
            folder_class_index(bad)
    with pytest.raises(DataError, match="'n99999999'"):
        folder_class_index("n99999999")


# -- ObjectNet -------------------------------------------------------------------------------------
def _objectnet(root, to_imagenet=None):
    """A mapping folder as ObjectNet 1.0 ships it, with 2012 ids a permutation of the usual indices
    (usual index k = 2012 id 7k mod 1000), so a reader that skips pytorch_to_imagenet_2012_id.json is wrong."""
    maps = root / "objectnet-1.0" / "mappings"
    maps.mkdir(parents=True)
    (maps / "folder_to_objectnet_label.json").write_text(json.dumps(
        {"alarm_clock": "Alarm clock", "banana": "Banana", "chair": "Chair"}))
    (maps / "objectnet_to_imagenet_1k.json").write_text(json.dumps(
        to_imagenet or {"Banana": "L21", "Alarm clock": "L7; L14"}))
    (maps / "pytorch_to_imagenet_2012_id.json").write_text(json.dumps({str(k): 7 * k % 1000 for k in range(1000)}))
    (maps / "imagenet_to_label_2012_v2").write_text("".join(f"L{i}\n" for i in range(1000)))
    return maps


def test_objectnet_classes_map_through_the_release_files(tmp_path):
    _objectnet(tmp_path)
    classes = objectnet_classes(tmp_path)
    assert [(c.folder, c.name, c.imagenet_indices) for c in classes] == [
        ("alarm_clock", "Alarm clock", (1, 2)), ("banana", "Banana", (3,))]  # "Chair" maps to no ImageNet class
    assert objectnet_classes(tmp_path / "objectnet-1.0") == classes  # root, root/mappings or the unpacked zip


def test_objectnet_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"mapping files not found.*objectnet-1.0/mappings"):
        objectnet_classes(tmp_path)
    _objectnet(tmp_path / "a", {"Banana": "L21; no such label"})
    with pytest.raises(DataError, match=r"objectnet_to_imagenet_1k.json: class 'Banana' .* 'no such label'"):
        objectnet_classes(tmp_path / "a")
    _objectnet(tmp_path / "b", {"Kettle": "L7"})
    with pytest.raises(DataError, match=r"'Kettle' has no folder"):
        objectnet_classes(tmp_path / "b")
    for i, bad in enumerate(("../../elsewhere", "/etc", "..")):  # a folder out of the release: never read
        maps = _objectnet(tmp_path / f"out{i}")
        (maps / "folder_to_objectnet_label.json").write_text(json.dumps({bad: "Banana"}))
        with pytest.raises(DataError, match=r"folder_to_objectnet_label.json: folder .* is not one folder name"):
            objectnet_classes(tmp_path / f"out{i}")
    maps = _objectnet(tmp_path / "c")
    (maps / OBJECTNET_MAPPING_FILES[1]).write_text("[1, 2]")
    with pytest.raises(DataError, match=r"objectnet_to_imagenet_1k.json: expected a JSON dict"):
        objectnet_classes(tmp_path / "c")


def test_lists_equal_timms_copies():
    """An independent copy of the same published lists (timm ships them with its ImageNet tools)."""
    from pathlib import Path

    timm = pytest.importorskip("timm")
    info = Path(timm.__file__).parent / "data" / "_info"
    if not (info / "imagenet_synsets.txt").is_file():
        pytest.skip("this timm has no _info lists")
    assert list(IMAGENET_WNIDS) == (info / "imagenet_synsets.txt").read_text().split()
    for name, sub in (("imagenet_r", shift_subset("imagenet-r")), ("imagenet_a", shift_subset("imagenet-a"))):
        assert sub == [int(x) for x in (info / f"{name}_indices.txt").read_text().split()]
