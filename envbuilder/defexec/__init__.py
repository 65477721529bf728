"""The definition file executed with buildah (`envbuilder defexec FOLDER`): the output folder's
Apptainer.def run section by section the way Apptainer runs it, with buildah instead of Apptainer
(which cannot be installed on every machine), and the image it gives compared with the
Dockerfile's. Not an Apptainer build: the Apptainer runtime itself is checked on clusters only.

deffile.py  the definition file split into stages and sections (Apptainer's parser rules)
execute.py  each stage: base image, /.singularity.d as Apptainer's conversion writes it, %files
            (from earlier stages, then from the folder), %post under `/bin/sh -ex` through
            /.singularity.d/actions/exec; the last stage's %environment, %runscript, %test,
            %help, %labels and the definition itself; committed as an image
contents.py what an image holds (files, Python distributions, dpkg packages), read from its
            file tree, and the difference between two images
"""
