"""What the tests of every tier share and import (fixtures are in the conftests): tiny models built from
configs (:mod:`.models`), the test data (:mod:`.data`), the dashboard under AppTest (:mod:`.pages`) and jobs as
the worker leaves them (:mod:`.jobs`)."""
