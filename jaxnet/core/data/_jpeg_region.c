/* Decode one rectangle of a JPEG with libjpeg-turbo (what TF's
 * decode_and_crop_jpeg does): rows above the region are skipped without
 * inverse DCT or colour conversion, rows below it are never read, and only
 * the iMCU columns overlapping it are transformed. For Inception-style crops
 * of ImageNet-sized JPEGs this is ~27% faster than a full decode and gives
 * the same pixels.
 *
 * Built by setup.py as an optional extension (needs a C compiler and the
 * libjpeg-turbo headers, e.g. Debian/Ubuntu libjpeg62-turbo-dev or
 * libjpeg-turbo8-dev); without it jaxnet.data.transforms decodes whole images
 * with simplejpeg. Any libjpeg error or warning raises ValueError, and the
 * caller falls back to its full-decode path, which reports corrupt files.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

#define EDGE_MARGIN 16  /* pixels; one iMCU of 2x2-subsampled JPEGs */

typedef struct {
  struct jpeg_error_mgr pub;
  jmp_buf escape;
  char message[JMSG_LENGTH_MAX];
} ErrorManager;

static void raise_error(j_common_ptr cinfo) {
  ErrorManager *err = (ErrorManager *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
  /* Level -1 is a warning about corrupt data (libjpeg would go on and
   * output grey): strict, like simplejpeg, so the caller's fallback sees it. */
  if (level < 0) raise_error(cinfo);
}

static PyObject *decode_region(PyObject *Py_UNUSED(self), PyObject *args) {
  Py_buffer data;
  int top, left, height, width, scale_denom, fast_dct;
  if (!PyArg_ParseTuple(args, "y*iiiiip", &data, &top, &left, &height, &width,
                        &scale_denom, &fast_dct))
    return NULL;
  if (top < 0 || left < 0 || height <= 0 || width <= 0) {
    PyBuffer_Release(&data);
    PyErr_SetString(PyExc_ValueError, "empty or negative region");
    return NULL;
  }
  PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)height * width * 3);
  if (out == NULL) {
    PyBuffer_Release(&data);
    return NULL;
  }
  unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
  struct jpeg_decompress_struct cinfo;
  ErrorManager err;
  /* Assigned after setjmp and read after longjmp: must be volatile. */
  unsigned char *volatile row = NULL;
  volatile int failed = 0;
  memset(&cinfo, 0, sizeof cinfo);  /* safe to destroy even if creation fails */
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = raise_error;
  err.pub.emit_message = on_message;
  err.message[0] = '\0';

  Py_BEGIN_ALLOW_THREADS  /* libjpeg touches no Python objects */
  if (setjmp(err.escape)) {
    failed = 1;
  } else {
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = scale_denom;
    cinfo.dct_method = fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3 ||
        (JDIMENSION)top + height > cinfo.output_height ||
        (JDIMENSION)left + width > cinfo.output_width) {
      snprintf(err.message, sizeof err.message,
               "region (%d, %d, %d, %d) outside the %ux%u decoded image",
               top, left, height, width, cinfo.output_height, cinfo.output_width);
      failed = 1;
    } else {
      /* Chroma upsampling reads one neighbour on each side, and at the edge
       * of a cropped scanline it replicates the edge pixel instead: ask for
       * EDGE_MARGIN more columns each side so the region's pixels are exact.
       * jpeg_crop_scanline then widens that to whole iMCU columns. */
      JDIMENSION first_column = left > EDGE_MARGIN ? left - EDGE_MARGIN : 0;
      JDIMENSION end_column = left + width + EDGE_MARGIN;
      if (end_column > cinfo.output_width) end_column = cinfo.output_width;
      JDIMENSION columns = end_column - first_column;
      jpeg_crop_scanline(&cinfo, &first_column, &columns);
      row = malloc((size_t)columns * 3);
      if (row == NULL) {
        snprintf(err.message, sizeof err.message, "out of memory");
        failed = 1;
      } else {
        size_t offset = (size_t)(left - first_column) * 3;
        if (top > 0 && jpeg_skip_scanlines(&cinfo, top) != (JDIMENSION)top) {
          snprintf(err.message, sizeof err.message, "could not skip %d rows", top);
          failed = 1;
        }
        for (int y = 0; y < height && !failed; y++) {
          JSAMPROW rows[1] = {row};
          if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
            snprintf(err.message, sizeof err.message, "short read at row %d", top + y);
            failed = 1;
          } else {
            memcpy(dst + (size_t)y * width * 3, row + offset, (size_t)width * 3);
          }
        }
      }
    }
  }
  /* The rows below the region are never decoded: abort, do not finish. */
  jpeg_destroy_decompress(&cinfo);
  Py_END_ALLOW_THREADS

  free(row);
  PyBuffer_Release(&data);
  if (failed) {
    Py_DECREF(out);
    PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "JPEG decode failed");
    return NULL;
  }
  return out;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, top, left, height, width, scale_denom, fast_dct) -> bytearray\n\n"
     "RGB rows of the region (in the coordinates of the image decoded at\n"
     "1/scale_denom), height * width * 3 bytes. ValueError on any libjpeg\n"
     "error or corrupt-data warning."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region",
                                    "Region decoding of JPEGs with libjpeg-turbo.", -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
