/* libjpeg's errors as a jump back to the decode's caller, its messages kept quiet: the
 * piece every compiled JPEG decode here shares (each says what a warning does). */

#ifndef SHARDFEED_JPEG_ERRORS_H
#define SHARDFEED_JPEG_ERRORS_H

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} Errors;

static void on_error(j_common_ptr cinfo)
{
    longjmp(((Errors *)cinfo->err)->jump, 1);
}

static void no_output(j_common_ptr cinfo)
{
    (void)cinfo;
}

#endif
