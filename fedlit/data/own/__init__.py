"""Data sets of the user's own files: image folders, clients as folders, arrays, torch Datasets.

Each is read once, by its source (:mod:`fedlit.data.sources`) when the data module is made (so
that its classes and channels are known before the model is built), into what every data set
is: uint8 images (N, C, H, W) and int64 labels (N,), described by a
:class:`~fedlit.data.datasets.DatasetSpec` whose ``loader`` hands back the splits read
(:class:`~fedlit.data.own.read.ReadImages`). So every partitioner, labels-at-client,
streaming and every executor work on them as on the built-in data sets.

- ``folder`` (``data.path``): ``train/<class>/*`` and ``test/<class>/*``, torchvision's
  ``ImageFolder`` layout (:mod:`~fedlit.data.own.folders`).
- ``client_folders`` (``data.path``): ``labeled/<class>/*`` (the server's labeled images),
  ``clients/<client>/*`` (each client's unlabeled images) and ``test/<class>/*``.
- ``arrays`` (``data.path``): one ``.npz`` or ``.pt`` file (:mod:`~fedlit.data.own.arrays`).
- a torch ``Dataset`` (``data.dataset`` and ``data.test_dataset``,
  :mod:`~fedlit.data.own.torch_datasets`).

The modules, from the ground up: :mod:`~fedlit.data.own.decode` decodes and fits images (one at a
time, or files in worker processes); :mod:`~fedlit.data.own.statistics` measures and caches the
normalisation statistics; :mod:`~fedlit.data.own.stored` reads a split the cache stored (its
checksum checked); :mod:`~fedlit.data.own.read` holds a data set read (``ReadImages``) and builds
its spec; :mod:`~fedlit.data.own.arrays` and :mod:`~fedlit.data.own.torch_datasets` read those
kinds; :mod:`~fedlit.data.own.cache` decodes image files once into a cache;
:mod:`~fedlit.data.own.folders` lists folders (no image read) and reads a listing through the cache,
handing ``ReadImages`` the stored splits to read again.

Anything wrong is a ValueError naming the file or the key, raised before anything is written.
"""
