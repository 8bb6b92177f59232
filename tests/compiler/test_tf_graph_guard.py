"""A TensorFlow graph is a program: a SavedModel or frozen graph with ops that touch files or call
Python is refused by node name before TensorFlow loads it (frontends/tf_guard.py). The SavedModel
here writes a marker file from a resource initialiser, which tf.saved_model.load would run."""
import pytest

from front_helpers import tf
from tl2k210.frontends import ModelLoadError, load_model

def test_savedmodel_whose_initialiser_writes_a_file_is_refused_unrun(tmp_path):
    t = tf()
    marker = tmp_path / "RAN"

    class Res(t.saved_model.experimental.TrackableResource):
        def _create_resource(self):
            return t.raw_ops.VarHandleOp(dtype=t.float32, shape=[], shared_name="x")

        def _initialize(self):
            t.io.write_file(str(marker), "ran")

    class M(t.Module):
        def __init__(self):
            self.r = Res()
            self.w = t.Variable(t.ones((3, 3, 3, 4)))

        @t.function(input_signature=[t.TensorSpec((1, 8, 8, 3), t.float32)])
        def serve(self, x):
            return t.nn.conv2d(x, self.w, 1, "SAME")
    m = M()
    t.saved_model.save(m, str(tmp_path / "sm"), signatures={"serving_default": m.serve})
    marker.unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match=r"node 'WriteFile' \(in function '__inference__initializer.*WriteFile op: it writes a file"):
        load_model(tmp_path / "sm")
    assert not marker.exists()


@pytest.mark.parametrize("op,why", [("WriteFile", "writes a file"), ("PyFunc", "calls Python"),
                                    ("TFRecordDataset", "input-pipeline"), ("DebugIdentityV2", "debugger")])
def test_frozen_graph_with_a_side_effect_op_is_refused(tmp_path, op, why):
    t = tf()
    gd = t.compat.v1.GraphDef()
    x = gd.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = 1
    bad = gd.node.add(name="sneaky", op=op)
    bad.input.append("x")
    gd.node.add(name="y", op="Identity").input.append("x")
    (tmp_path / "g.pb").write_bytes(gd.SerializeToString())
    with pytest.raises(ModelLoadError, match=f"node 'sneaky' is a {op} op: .*{why}"):
        load_model(tmp_path / "g.pb")


def test_print_to_a_file_is_refused_to_stderr_is_not(tmp_path):
    from tl2k210.frontends.tf_guard import refuse_side_effects
    t = tf()
    gd = t.compat.v1.GraphDef()
    p = gd.node.add(name="p", op="PrintV2")
    p.attr["output_stream"].s = b"stderr"
    refuse_side_effects([gd], "g.pb")
    p.attr["output_stream"].s = b"file:///tmp/x"
    with pytest.raises(ModelLoadError, match="prints to a file"):
        refuse_side_effects([gd], "g.pb")
