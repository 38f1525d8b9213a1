"""Names shared by every part: special tokens, file names and the served tensors' names."""

PAD_INDEX = 0  # vocabulary index 0 is padding; items are 1..N, the mask token N + 1

# Prepared data folder (recserve data)
DATASET_FILE = "dataset.json"
ITEMS_FILE = "items.parquet"
SEQUENCES_FILE = "sequences.parquet"
DATA_FORMAT_VERSION = 1

# Training run folder (recserve train)
MODEL_CONFIG_FILE = "model_config.json"
WEIGHTS_FILE = "model.pt"
VALIDATED_WEIGHTS_FILE = "model_validated.pt"  # with --refit: the weights validation chose, beside the refit
ITEM_TABLE_FILE = "item_ids.npy"  # sorted item IDs (index i + 1 is ids[i]); also in every export
POPULARITY_FILE = "popularity.npy"  # interaction counts by index, padding and mask included
RULE_BANK_FILE = "rules.pt"  # a ruled native model's version folder: the rules recserve's backend reads
METRICS_FILE = "metrics.json"
RUN_FILE = "run.json"  # what trained the run: model, settings, data (a rerun must agree)

# Export folder (recserve export): what the serving core loads
EXPORT_MANIFEST = "export.json"

# Model repository (recserve repo): Triton's folders plus recserve's record of what it serves
REPOSITORY_FILE = "recserve.json"

# Served model `recommender` (fused layout)
FUSED_MODEL = "recommender"
INPUT_ITEM_IDS = "item_ids"
INPUT_K = "k"
INPUT_EXCLUDE_SEEN = "exclude_seen"
OUTPUT_ITEM_IDS = "item_ids"
OUTPUT_SCORES = "scores"
DEFAULT_K = 10
DEFAULT_MAX_K = 100
OUTPUT_UNKNOWN_IDS = "unknown_item_ids"  # INT32 [1]: history IDs not in the vocabulary (dropped)
# item IDs one row of a request may bring: a history (the newest up to the model's window are read) or the items a
# session appends; more is refused before any work (recserve's backend: kMaxAppended)
MAX_REQUEST_ITEMS = 4096

# Seed-compatible layout (the PoC's names)
SEED_ENSEMBLE = "bert4rec_ensemble"
SEED_PREPROCESSING = "bert4rec_preprocessing"
SEED_MODEL = "bert4rec"
SEED_POSTPROCESSING = "bert4rec_postprocessing"
SEED_INPUT = "inputs"
SEED_OUTPUT_IDS = "output__0"
SEED_OUTPUT_SCORES = "output__1"
SEED_HISTORY_LENGTH = 39
SEED_K = 10
SEED_TOKENS = "tokens"  # preprocessing -> model: the indices with the mask token appended
SEED_MODEL_INPUT = "input__0"  # the model step's input (the PoC's TorchScript naming)
SEED_INDICES = "indices"  # model -> postprocessing: top-k vocabulary indices
SEED_TOP_SCORES = "top_scores"  # model -> postprocessing: their scores

ECHO_MODEL = "echo"

# Business rules (recserve.rules): what a request may keep out of its answer
INPUT_RULE = "rule"  # BYTES [1], optional: a rule stored with the repository, by name
INPUT_WHERE = "where"  # BYTES [1], optional: a rule written out (docs/rules.md)
INPUT_EXCLUDE_ITEMS = "exclude_item_ids"  # the item_ids' type [-1], optional: items never to recommend
INPUT_INCLUDE_ITEMS = "include_item_ids"  # the item_ids' type [-1], optional: the only items to recommend
MAX_RULE_ITEMS = 1024  # excluded or included items of one request
MAX_RULE_MASKS = 64  # the catalogue-wide masks one model keeps at once (compiled rules, LRU)

# Session layout: the `recommender` contract by session ID, the history kept in a session store
SESSION_MODEL = "recommender_session"
INPUT_SESSION_ID = "session_id"  # BYTES [1] a row: the session to answer (item_ids, optional: appended first)
# BYTES [-1] a row, optional (the session layout): the client's ID of each item to append, as item_ids holds them
# ("" where the client has none): an event sent again with its ID (a retry) is stored once
INPUT_EVENT_IDS = "event_ids"
# the session layout's events-only model: session_id, item_ids and event_ids in; how many of each row's items
# the store acknowledged (stored now, or stored before under their event IDs) out, and nothing else
EVENTS_MODEL = "events"
OUTPUT_STORED = "stored"  # INT32 [1] a row
OUTPUT_HISTORY_SOURCE = "history_source"  # INT32 [1]: HISTORY_FROM_STORE, or HISTORY_FROM_REQUEST (store down)
OUTPUT_HISTORY_LENGTH = "history_length"  # INT32 [1]: the items the answer was computed from
HISTORY_FROM_STORE = 0
HISTORY_FROM_REQUEST = 1
# what a client is told when the store fails a request (UNAVAILABLE): never the store's address or keys
STORE_UNAVAILABLE = "the session store is unavailable; the server's log says why"
# the same by session on recserve's own backend: the store read in C++ (hiredis), the native graph scored
NATIVE_SESSION_MODEL = "recommender_native_session"
NATIVE_EVENTS_MODEL = "events_native"  # the events model on recserve's backend, beside it: appends in C++

# Native layout: the whole serving graph in one TorchScript or ONNX model on Triton's own backends
NATIVE_MODEL = "recommender_native"
FLOOR_MODEL = "recommender_floor"  # the native contract on recserve's backend answered without a graph
NATIVE_PAD_ID = -1  # fills item_ids on the left up to the model's fixed length, and the answer past k
NATIVE_TORCHSCRIPT_FILE = "native.pt"  # in a torchscript export: the native graph
NATIVE_ONNX_FILE = "native.onnx"  # in an onnx export: the native graph (dense integer IDs only)
NATIVE_ONNX_OUTPUT_IDS = "top_item_ids"  # an ONNX graph cannot name an output like its input item_ids
SEED_TORCHSCRIPT_FILE = "seed.pt"  # in a torchscript export: the seed layout's model step

# Server ports (recserve serve, the clients' defaults)
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002

# Model instances a SageMaker triton package asks for, by its export's device: set for the endpoint's machine,
# not the packaging one's cores (4 CPU instances suit the 4 vCPUs of an ml.m5.xlarge or ml.c5.xlarge; on a GPU
# Triton places the count on each GPU, and 2 overlap one's copies and launches)
PACKAGE_INSTANCES = {"cpu": 4, "gpu": 2}
