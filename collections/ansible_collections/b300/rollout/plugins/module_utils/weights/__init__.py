"""The model weights stage: its decisions on manifests and directories (model_weights), the file system and HTTP work
(model_weights_io), and the engine of the model_weights_stage module (model_weights_stage)."""
