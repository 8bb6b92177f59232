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


def test_a_frozen_detection_pipeline_is_refused_by_what_makes_it_one(tmp_path):
    """tf-mtcnn's frozen graph runs the whole detector (an image-pyramid while loop, three networks,
    NMS, box crops, 4 Placeholders): tf2onnx failed on it with "TypeError: '' is not an accepted
    attribute value" and the advice to give --input-shape. Refused naming the suppression, the
    crops and the inputs; a while loop alone (a TF1 dynamic_rnn) is left to its own refusal."""
    from tl2k210.frontends.frozen_pb import refuse_pipeline
    t = tf()
    gd = t.compat.v1.GraphDef()
    for name in ("image", "min_size"):
        gd.node.add(name=name, op="Placeholder").attr["dtype"].type = 1
    gd.node.add(name="pnet/while/Enter", op="Enter").input.append("image")
    refuse_pipeline(gd, "rnn.pb")                      # a loop alone: no refusal here
    gd.node.add(name="pnet/nms", op="NonMaxSuppressionV2").input.append("pnet/while/Enter")
    gd.node.add(name="rnet/crop", op="CropAndResize").input.append("image")
    gd.node.add(name="out", op="Identity").input.append("rnet/crop")
    (tmp_path / "mtcnn.pb").write_bytes(gd.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"a whole pipeline, not one network: a TF1 while loop \(1 nodes, e.g. "
                                             r"'pnet/while/Enter'\); non-maximum suppression .*'pnet/nms'.*crop-and-"
                                             r"resize.*2 inputs \('image', 'min_size'\).*export each network"):
        load_model(tmp_path / "mtcnn.pb")


def test_a_frozen_recurrent_layer_tf2onnx_fails_on_is_named(tmp_path, monkeypatch):
    """Mycroft Precise's wake-word .pb (a Keras GRU: a TF1 while loop) made tf2onnx write a graph
    the ONNX checker refuses, and the message said the input had no shape, then ended mid-sentence
    (hunt 19). A tf2onnx failure on a graph with a while loop names the loop as a recurrent layer."""
    from tl2k210.frontends import frozen_pb
    t = tf()
    with t.Graph().as_default() as g:
        x = t.compat.v1.placeholder(t.float32, (1, 4), name="net_input")
        _, y = t.compat.v1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, t.tanh(v)), [t.constant(0), x])
        t.identity(y, name="out")
    (tmp_path / "gru.pb").write_bytes(g.as_graph_def().SerializeToString())

    def broken(*a, **k):
        raise ModelLoadError("gru.pb: not a valid ONNX model: Nodes in a graph must be topologically sorted")
    monkeypatch.setattr(frozen_pb, "tf_convert", broken)
    with pytest.raises(ModelLoadError, match=r"node '[^']*while[^']*' is part of a TensorFlow while loop, a "
                                             r"recurrent layer's .*no loops: use a model whose recurrent layers"):
        load_model(tmp_path / "gru.pb")
