"""The Triton shell: config.pbtxt from typed settings, the model repository, python models, the launcher."""
