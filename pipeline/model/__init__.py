"""The CLIP towers: the ``model`` section, HF towers with the project's layouts, OpenCLIP weights in and out."""
