"""Picking a command's tensors from its FILEs (``fmtcli.inputs.pick``) and the loader's
one suffix table (``fmtcli.inputs.files``).

Every command that reads FILEs says, when nothing in them is usable, what it wanted them
for (``fmt dot`` on int64 tensors: "nothing to multiply", not quantize's "nothing to
quantize"), checked in a fresh process as a user runs it.  The picker takes tensors by
count and, from one file, by the role their names give (a/b, q/k/v), and every command
shares its messages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_fmt

from fmtcli.base.errors import DataError
from fmtcli.inputs import checkpoints, files, tensors
from fmtcli.inputs.pick import pick, pick_file, role_name

INPUTS = Path(__file__).resolve().parents[2] / "fmtcli" / "inputs"


@pytest.fixture
def ints(tmp_path) -> Path:
    """A folder with int64 tensors only: x.npz (a, b), i.npy, and an empty e.npz."""
    np.savez(tmp_path / "x.npz", a=np.arange(6).reshape(2, 3), b=np.arange(6).reshape(3, 2))
    np.save(tmp_path / "i.npy", np.arange(6))
    np.savez(tmp_path / "e.npz")
    return tmp_path


# every command that reads FILEs, on int64 tensors: its own words for what it reads them for
PURPOSES = [
    (["dot", "x.npz"], "nothing to multiply ('"),
    (["dot", "e.npz"], "nothing to multiply ('"),
    (["attention", "x.npz"], "nothing to attend over ('"),
    (["sum", "i.npy"], "nothing to sum ('"),
    (["softmax", "--scores", "i.npy", "--values", "1,2,3,4,5,6"], "nothing for the softmax ('"),
    (["kv", "--k", "i.npy"], "no usable K or V tensor ('"),
    (["quantize", "x.npz"], "nothing to quantize ('"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "words"), PURPOSES, ids=[" ".join(a) for a, _ in PURPOSES])
def test_a_command_with_nothing_usable_says_what_it_wanted_the_tensors_for(ints, args, words):
    done = run_fmt(*[str(ints / a) if a.endswith((".npz", ".npy")) else a for a in args])
    err = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b"", (done.returncode, err)
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "int64" in err or "hold no tensors" in err, err
    if args[0] != "quantize":
        assert "quantize" not in err, err


def test_one_file_gives_the_tensors_named_for_their_roles_whatever_else_it_holds(tmp_path):
    path = tmp_path / "qkv.npz"
    np.savez(path, mask=np.ones((4, 8)), **{"attn.value": np.ones((4, 8)),
                                            "attn.q": np.ones((4, 8)), "attn.k": np.ones((4, 8))})
    roles = ({"q", "query"}, {"k", "key"}, {"v", "value"})
    chosen = pick([str(path)], purpose="to attend over", taker="fmt attention", count=3,
                  roles=roles)
    assert [s.key for s in chosen] == ["attn.q", "attn.k", "attn.value"]
    assert [role_name(s) for s in chosen] == ["q", "k", "value"]
    # a role named twice: no role picking, and four are not three
    np.savez(path, q=np.ones(2), query=np.ones(2), k=np.ones(2), v=np.ones(2))
    with pytest.raises(DataError, match=r"holds 4 usable tensors \(fmt attention takes three"):
        pick([str(path)], purpose="to attend over", taker="fmt attention", count=3,
             roles=roles)


def test_the_count_message_names_the_taker_and_why_tensors_were_left_out(tmp_path):
    path = tmp_path / "ab.npz"
    np.savez(path, a=np.ones((2, 2)), b=np.arange(4))
    with pytest.raises(DataError) as caught:
        pick([str(path)], purpose="to multiply", taker="fmt dot", count=2, how=" (A and B)")
    assert str(caught.value) == (f"'{path}' holds 1 usable tensor (fmt dot takes two (A and B)) "
                                 f"('{path}:b': dtype int64 is not a real floating-point type)")
    np.save(tmp_path / "one.npy", np.ones(3))
    with pytest.raises(DataError, match=r"hold 3 usable tensors \(fmt sum takes one\)$"):
        pick([str(tmp_path / "one.npy")] * 3, purpose="to sum", taker="fmt sum")


def test_a_directory_is_refused_where_one_file_is_taken(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(3))
    with pytest.raises(DataError, match=r"is a directory \(--scores takes one file\)"):
        pick_file(str(tmp_path), purpose="for the softmax", taker="--scores")
    assert pick_file(str(tmp_path / "x.npy"), purpose="to sum", taker="fmt sum").shape == (3,)


def test_the_suffix_table_is_the_one_list_of_suffixes():
    """files.TABLE says which suffix which loader reads; the error hint, a folder's walk
    and the text rule are views of it, and no other module of inputs/ spells a suffix."""
    assert files.SUFFIXES == tuple(files.TABLE) == tensors.SUFFIXES
    assert files.TENSOR_SUFFIXES == (".npy", ".npz", ".safetensors", ".pt", ".pth",
                                     ".ckpt")
    assert files.TEXT_SUFFIXES == (".txt", ".csv", ".json")
    assert checkpoints.TENSOR_SUFFIXES is files.TENSOR_SUFFIXES
    assert checkpoints.HF_FORMATS == (".safetensors", ".bin")  # safetensors preferred
    spelled = {}
    for module in INPUTS.glob("*.py"):
        tree = ast.parse(module.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and id(node) not in docstrings and node.value in files.TABLE}
        if found:
            spelled[module.name] = found
    assert spelled.pop("npyfile.py") == {".npy"}  # an .npz archive's members are NAME.npy
    assert list(spelled) == ["files.py"], spelled


def test_a_folder_reads_its_files_through_the_same_checks(tmp_path):
    """A FIFO named like a tensor file inside a folder is refused as one given alone is."""
    import os

    os.mkfifo(tmp_path / "pipe.npy")
    for given in (tmp_path, tmp_path / "pipe.npy"):
        with pytest.raises(DataError, match="not a regular file"):
            tensors.load_path(str(given))
